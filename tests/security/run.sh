#!/usr/bin/env bash
# The junk probe (docs/security.md): 10,000 requests with junk methods and
# paths and no key against a fresh service; /metrics must stay under
# 100 KB and the RSS within 10 MB of its start. About half a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# shellcheck source=tests/lib/service.sh
source tests/lib/service.sh
trap stop_service EXIT
start_service junk_probe
python3 tests/security/junk_probe.py "$TB_URL" "$service_pid" "${1:-10000}"
