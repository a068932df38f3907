"""vLLM: the offline engine (offline.py), the served client (served.py), and the hook they use
inside vLLM's workers (worker.py; plugin.py installs it in a server's). seam/ is the one
package that touches vLLM; wire.py the request format both sides share, and all a client needs;
policy.py what a server's operator allows the hook to read and write."""
