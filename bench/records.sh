#!/usr/bin/env bash
# The controller's memory against the number of controller records (#48): a real `flexd serve
# --mode controller --controller-records kubernetes` against a stand-in API server holding N
# FlexdRecord objects (bench/records_apiserver.py, HTTPS on 127.0.0.1), its whole ListVolumes
# listing walked through the CSI socket (bench/records_list.py, grpcio): LARGE records walked
# WALKS times, against the baseline, BASE records, in the same run, walked as many times as it
# takes to serve as many pages (WALKS x LARGE/BASE walks): both flexds answer the same number
# of ListVolumes calls, so what differs is the number of records alone. Each N has a fresh
# stand-in and a fresh flexd.
#
# It prints per N: pages per walk, the page latency (median, p90), the median walk, flexd's RSS
# once started and its peak (VmHWM) after the first and the last walk; then LARGE over BASE for
# the peak RSS (flat when memory follows the page), the page latency (flat) and the walk
# (linear: LARGE/BASE). Then what the stand-in was asked: every list must carry a limit, the
# largest 500.
#
# The driver (bench/prov) provisions and does not attach, so ListVolumes runs no isattached:
# what is measured is the records' path alone. Root or not: every directory is a temporary one.
# Usage: bench/records.sh [BASE=1000] [LARGE=100000] [WALKS=3]
# FLEXD=path/to/flexd uses that binary (default: cargo build --release -p flexd).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-1000}
LARGE=${2:-100000}
WALKS=${3:-3}
DRIVER=bench/prov
CSI_NAME=flexvolume-bench--prov # docs/csi.md#csi-name
NAMESPACE=flexd-system
die() {
  echo "records.sh: $*" >&2
  exit 1
}
command -v python3 >/dev/null || die "needs python3"
command -v openssl >/dev/null || die "needs openssl (the stand-in's certificate)"
python3 -c 'import grpc' 2>/dev/null || python3 -m pip install --quiet grpcio ||
  die "needs Python's grpcio (python3 -m pip install grpcio)"
if [ -z "${FLEXD:-}" ]; then
  cargo build --release -q -p flexd
  FLEXD=target/release/flexd
fi
FLEXD=$(realpath "$FLEXD")
[ -x "$FLEXD" ] || die "$FLEXD is not executable"

work=$(mktemp -d "${TMPDIR:-/tmp}/flexd-records-bench.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The API server's certificate, self-signed for 127.0.0.1 (CA:FALSE: rustls refuses a CA
# certificate as a server's own), and the controller's records credentials.
creds=$work/credentials
mkdir "$creds"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/apiserver.key" -out "$creds/ca.crt" 2>/dev/null
# No newline after the token: flexd's client (kube-rs) sends the file as it is, and a newline is
# not allowed in a header (client-go trims it; a projected token has none).
printf 'bench-token-%s' "$RANDOM$RANDOM" >"$creds/token"
echo "$NAMESPACE" >"$creds/namespace"

# Waits up to $2 s for `test -e $1`, as long as process $3 lives.
wait_for() {
  local deadline=$((SECONDS + $2))
  until [ -e "$1" ]; do
    kill -0 "$3" 2>/dev/null || return 1
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# One measurement: N records walked WALKS times, a fresh stand-in and a fresh flexd;
# $work/<N>/result.json.
measure() {
  local n=$1 walks=$2 d=$work/$1
  mkdir -p "$d/plugins/bench~prov" "$d/csi" "$d/registration"
  mkdir -m 700 "$d/state"
  cat >"$d/plugins/bench~prov/prov" <<'EOF'
#!/bin/sh
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":false,"provision":true}}';;
*) echo '{"status":"Not supported"}'; exit 1;;
esac
EOF
  chmod 755 "$d/plugins/bench~prov/prov"

  echo "== $n records: starting the stand-in API server" >&2
  python3 bench/records_apiserver.py --records "$n" --driver "$DRIVER" --namespace "$NAMESPACE" \
    --cert "$creds/ca.crt" --key "$work/apiserver.key" --token-file "$creds/token" \
    --port-file "$d/port" 2>"$d/apiserver.log" &
  local api=$!
  pids+=("$api")
  wait_for "$d/port" 300 "$api" || { cat "$d/apiserver.log" >&2; die "the stand-in did not start"; }
  local port
  port=$(cat "$d/port")

  echo "== $n records: starting flexd serve --mode controller" >&2
  KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=$port \
    "$FLEXD" --plugin-dir "$d/plugins" --state-dir "$d/state" --node-name bench-controller \
    serve --mode controller --controller-records kubernetes --records-credentials "$creds" \
    --csi-dir "$d/csi" --registration-dir "$d/registration" --metrics-address 127.0.0.1:0 \
    2>"$d/flexd.log" &
  local flexd=$!
  pids+=("$flexd")
  local socket=$d/csi/$CSI_NAME/csi.sock
  wait_for "$socket" 120 "$flexd" || { cat "$d/flexd.log" >&2; die "flexd's socket $socket did not appear"; }
  local rss_start
  rss_start=$(status_kib "$flexd" VmRSS)

  echo "== $n records: walking the listing $walks times" >&2
  # In the background, so that a signal ends the bench at once (bash runs a trap only once a
  # foreground command ended).
  timeout 900 python3 bench/records_list.py "$socket" "$n" "$walks" "$flexd" >"$d/walk.json" &
  local client=$!
  pids+=("$client")
  wait "$client" || { tail -20 "$d/flexd.log" >&2; die "the ListVolumes walk of $n records failed"; }
  kill -0 "$flexd" 2>/dev/null || { cat "$d/flexd.log" >&2; die "flexd exited"; }
  local hwm
  hwm=$(status_kib "$flexd" VmHWM)
  python3 - "$port" "$creds/ca.crt" >"$d/stats.json" <<'EOF'
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
url = "https://127.0.0.1:%s/_bench/stats" % sys.argv[1]
print(urllib.request.urlopen(url, context=context, timeout=30).read().decode())
EOF
  kill "$flexd" "$api"
  wait "$flexd" 2>/dev/null || true
  wait "$api" 2>/dev/null || true
  pids=()
  local warnings
  warnings=$(grep -cE ' (WARN|ERROR) ' "$d/flexd.log" || true)
  if [ "$warnings" != 0 ]; then
    echo "flexd logged $warnings warnings or errors with $n records:" >&2
    grep -E ' (WARN|ERROR) ' "$d/flexd.log" | head -5 >&2
  fi
  python3 - "$n" "$rss_start" "$hwm" "$warnings" "$d/walk.json" "$d/stats.json" \
    >"$d/result.json" <<'EOF'
import json, sys
n, rss_start, hwm, warnings = (int(a) for a in sys.argv[1:5])
result = json.load(open(sys.argv[5]))
result.update(records=n, rss_start_kib=rss_start, peaks_kib=result["vmhwm_kib"],
              vmhwm_kib=hwm, warnings=warnings,
              apiserver=json.load(open(sys.argv[6])))
print(json.dumps(result))
EOF
}

echo "flexd: $FLEXD ($("$FLEXD" --version))" >&2
[ "$LARGE" -gt "$BASE" ] || die "LARGE ($LARGE) must be more than BASE ($BASE)"
measure "$BASE" $(((WALKS * LARGE + BASE - 1) / BASE))
measure "$LARGE" "$WALKS"

python3 - "$work/$BASE/result.json" "$work/$LARGE/result.json" <<'EOF'
import json, statistics, sys
base, large = (json.load(open(p)) for p in sys.argv[1:3])
mib = lambda kib: "%.1f" % (kib / 1024)
print("| records | walks | pages per walk | page: median (p90) | walk: median "
      "| flexd RSS once started | flexd peak RSS, first walk → last | stand-in peak RSS |")
print("|---|---|---|---|---|---|---|---|")
for r in (base, large):
    r["page"] = statistics.median(r["page_ms"])
    p90 = statistics.quantiles(r["page_ms"], n=10)[-1]
    r["walk"] = statistics.median(r["walk_s"])
    print("| %d | %d | %d | %.2f ms (%.2f) | %.3f s | %s MiB | %s → %s MiB | %s MiB |" % (
        r["records"], len(r["walk_s"]), statistics.median(r["pages"]), r["page"], p90,
        r["walk"], mib(r["rss_start_kib"]), mib(r["peaks_kib"][0]), mib(r["vmhwm_kib"]),
        mib(r["apiserver"]["vmhwm_kib"])))
times = large["records"] / base["records"]
print()
print("%d/%d records: flexd's peak RSS %.2fx, page latency %.2fx, whole walk %.1fx "
      "(linear: %.0fx)" % (
    large["records"], base["records"], large["vmhwm_kib"] / base["vmhwm_kib"],
    large["page"] / base["page"], large["walk"] / base["walk"], times))
lists = sum(r["apiserver"]["lists"] for r in (base, large))
unlimited = sum(r["apiserver"]["unlimited_lists"] for r in (base, large))
largest = max(r["apiserver"]["largest_limit"] for r in (base, large))
refused = sum(r["apiserver"]["refused"] + r["apiserver"]["unauthorized"] for r in (base, large))
answered = max(max(r["page_sizes"]) for r in (base, large))
print("the stand-in served %d lists: %d without a limit (must be 0), the largest limit %d "
      "(must be 500); %d other requests refused; the largest ListVolumes answer %d entries; "
      "%d warnings in flexd's logs" % (lists, unlimited, largest, refused, answered,
      base["warnings"] + large["warnings"]))
if unlimited or largest != 500 or refused or answered > 500:
    sys.exit("FAILED: flexd asked the API server for more than a page, or for something else")
EOF
