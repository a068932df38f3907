# Sourced by the setup scripts: `install VENV PIP-INSTALL-ARGS...` installs into the environment
# VENV with uv where uv can, else with pip.
#
# pip resolves, downloads and unpacks vLLM's ~200 wheels one at a time (about 2 minutes of a
# fresh setup on a 2-core machine); uv does the same in parallel (about 20 s). uv comes from the
# package registries like everything else, and is given what pip's configuration names (indexes,
# local wheel directories, constraint files), choosing among all indexes as pip does, and compiles
# the modules' bytecode at install as pip does (else every first import would). Where uv
# cannot be installed, or fails for any reason, pip installs instead, so uv only ever saves time.
# KLDTOOL_SETUP_PIP_ONLY=1 skips uv where a venv does not have it yet.

_uv_sources() {  # pip's configured sources and constraints, as uv's options
  local py=$1 line key value item
  "$py" -m pip config list 2>/dev/null | while IFS= read -r line; do
    key=${line%%=*}
    key=${key#*.}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    for item in $value; do
      case $item in file://*) [ -e "${item#file://}" ] || continue ;; esac
      case $key in
        index-url) echo "--index-url=$item" ;;
        extra-index-url) echo "--extra-index-url=$item" ;;
        find-links) if [ -e "$item" ] || [[ $item == *://* ]]; then echo "--find-links=$item"; fi ;;
        constraint) if [ -f "$item" ]; then echo "--constraint=$item"; fi ;;
      esac
    done
  done | sort -u
}

install() {
  local venv=$1
  shift
  local py=$venv/bin/python
  if [ ! -x "$venv/bin/uv" ] && [ -z "${KLDTOOL_SETUP_PIP_ONLY:-}" ]; then
    "$py" -m pip install -q uv >/dev/null 2>&1 || true
  fi
  if [ -x "$venv/bin/uv" ]; then
    local sources
    mapfile -t sources < <(_uv_sources "$py")
    if "$venv/bin/uv" pip install -q --python "$py" --index-strategy unsafe-best-match --compile-bytecode "${sources[@]}" "$@"; then
      return 0
    fi
    echo "setup: uv could not install $*; pip installs it instead" >&2
  fi
  if [ "${_pip_upgraded:-}" != "$venv" ]; then
    "$py" -m pip install -q --upgrade pip
    _pip_upgraded=$venv
  fi
  "$py" -m pip install -q "$@"
}
