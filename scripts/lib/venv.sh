# Sourced by scripts/test and scripts/demo: the one place that sets up .venv.
#
#   ensure_venv SPEC STAMP MESSAGE   # e.g. ensure_venv '.[dev]' .venv/.agentlog-installed ""
#
# Creates .venv if missing, then installs SPEC (editable) only when pyproject.toml (the one source
# of the dependencies) or the Python changed since the install that wrote STAMP: the install is
# editable, so a code change needs none. MESSAGE, when not empty, is printed before an install.
#
# Why uv: pip fetches and resolves one package at a time; on a fresh 2-core machine the dev
# install took 40 s quiet and over 2 minutes under load, uv about 8 s (one wheel of its own, then
# parallel downloads; the same versions). Where uv cannot be had (offline, an unusual platform),
# pip does the install.
#
# Why --compile-bytecode: uv installs no bytecode (pip does), and where PYTHONDONTWRITEBYTECODE is
# set (as on this project's machines) nothing writes it later, so every process compiled the
# modules it imports from source: an `agentlog serve` spent ~0.8 s of CPU more to start (1.7 s
# against 0.9 s for its imports), the test suite's few hundred processes some minutes of CPU. Once
# at install it costs ~20 s of CPU.
ensure_venv() {
    local spec="$1" stamp="$2" message="$3" want
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) $(.venv/bin/python -c 'import sys; print(sys.version)' | head -1)"
    if [ -x .venv/bin/agentlog ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    [ -z "$message" ] || echo "$message" >&2
    if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --disable-pip-version-check -q uv >/dev/null 2>&1; then
        .venv/bin/uv pip install --python .venv/bin/python -q --compile-bytecode -e "$spec"
    else
        .venv/bin/python -m pip install --disable-pip-version-check -q -e "$spec"
    fi
    echo "$want" > "$stamp"
}
