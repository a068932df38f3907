"""The xLSTM engine for helibrunna training runs (engine.py), and a run's layout and history
(helibrunna.py)."""
