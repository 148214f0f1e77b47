#!/usr/bin/env bash
# Retrains the lifetime models on the system's own history and offers the new bundle as a canary:
#
#   scripts/retrain.sh --allocator URL --inference URL --models-dir DIR --bundle NAME \
#       [--from-s S] [--to-s S] [--max-rows N] [--share X] [--min-resolved N] [--margin X] [--manual] \
#       [--version V] [--bin-dir DIR] [--work-dir DIR] [-- LIFETIME-TRAIN OPTIONS...]
#
#   1. downloads the allocator's trace export (GET /v1/export) of the VMs that started in
#      [--from-s, --to-s) on the model's clock: placements and exits, with the request features
#      they carried (running VMs censored);
#   2. checks that it reads as a trace (`vmtrace stats`) with as many VMs as the allocator sent;
#   3. trains a bundle on it (`lifetime-train`; options after `--` go to the trainer);
#   4. copies the bundle into the models directory atomically, under --bundle, which must not exist
#      yet: its files into a hidden temporary directory in the models directory, renamed into place,
#      the manifest (what makes a directory a bundle to the server) renamed in last;
#   5. has the inference server rescan the directory (POST /v1/models/reload), checks that the
#      bundle is valid, and offers it as a canary (POST /v1/models/canary) with --share (default
#      0.1) and, unless --manual, `auto = true`: the control service promotes or rolls it back by
#      its realized quality (--min-resolved, --margin; docs/control-service.md).
#
# Options:
#   --allocator URL      the zone's allocator, e.g. http://127.0.0.1:8082
#   --inference URL      an inference server serving --models-dir, e.g. http://127.0.0.1:8081
#   --models-dir DIR     the inference server's models directory
#   --bundle NAME        the new bundle's directory name ([A-Za-z0-9][A-Za-z0-9._-]*)
#   --from-s S, --to-s S the window on the model's clock (default: everything the allocator keeps)
#   --max-rows N         at most N VMs, the earliest (default: the allocator's, 1,000,000)
#   --share X            the canary's share of traffic, in (0, 1] (default 0.1)
#   --min-resolved N     resolved VMs each side needs before the canary is judged
#   --margin X           how much worse its realized average precision may be, in [0, 1]
#   --manual             offer the canary without `auto` (promote or roll back by hand)
#   --version V          the bundle's version (default NAME-<Unix time>)
#   --bin-dir DIR        where `vmtrace` and `lifetime-train` are (default target/release, built
#                        with cargo when missing; a DIR given here is never built into)
#   --work-dir DIR       keep the export and the trainer's output in DIR (default: a temporary
#                        directory, removed at the end)
#   -h, --help           this text
#
# Environment: ALLOCATOR_ADMIN_TOKEN and INFERENCE_ADMIN_TOKEN, the bearer tokens of the two
# services' admin routes (both required; never passed on a command line). Needs curl. The admin
# tokens pass the services' service-credential check too, so no service token is needed.
# Each step that fails stops the script with a message naming the step; the models directory is
# left as it was unless the bundle was copied in whole (a failed copy is removed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { echo "retrain: $*"; }
warn() { echo "retrain: WARNING: $*" >&2; }
die() { echo "retrain: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

ALLOCATOR="" INFERENCE="" MODELS_DIR="" BUNDLE="" FROM_S="" TO_S="" MAX_ROWS="" SHARE=0.1
MIN_RESOLVED="" MARGIN="" AUTO=true VERSION="" BIN_DIR="" WORK_DIR="" TRAIN_ARGS=()
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --allocator) need_value "$@"; ALLOCATOR="${2%/}"; shift 2 ;;
        --inference) need_value "$@"; INFERENCE="${2%/}"; shift 2 ;;
        --models-dir) need_value "$@"; MODELS_DIR="$2"; shift 2 ;;
        --bundle) need_value "$@"; BUNDLE="$2"; shift 2 ;;
        --from-s) need_value "$@"; FROM_S="$2"; shift 2 ;;
        --to-s) need_value "$@"; TO_S="$2"; shift 2 ;;
        --max-rows) need_value "$@"; MAX_ROWS="$2"; shift 2 ;;
        --share) need_value "$@"; SHARE="$2"; shift 2 ;;
        --min-resolved) need_value "$@"; MIN_RESOLVED="$2"; shift 2 ;;
        --margin) need_value "$@"; MARGIN="$2"; shift 2 ;;
        --manual) AUTO=false; shift ;;
        --version) need_value "$@"; VERSION="$2"; shift 2 ;;
        --bin-dir) need_value "$@"; BIN_DIR="$2"; shift 2 ;;
        --work-dir) need_value "$@"; WORK_DIR="$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) shift; TRAIN_ARGS=("$@"); break ;;
        *) die "unknown argument \`$1\` (see --help)" ;;
    esac
done

# --- the arguments -------------------------------------------------------------------------------
NUMBER='^-?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$'
[[ -n "$ALLOCATOR" ]] || die "--allocator URL is required (see --help)"
[[ -n "$INFERENCE" ]] || die "--inference URL is required (see --help)"
[[ -n "$MODELS_DIR" ]] || die "--models-dir DIR is required (see --help)"
[[ -n "$BUNDLE" ]] || die "--bundle NAME is required (see --help)"
[[ "$BUNDLE" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--bundle \`$BUNDLE\`: use letters, digits, '.', '_' and '-', not first"
[[ -d "$MODELS_DIR" ]] || die "--models-dir $MODELS_DIR is not a directory"
[[ ! -e "$MODELS_DIR/$BUNDLE" ]] || die "$MODELS_DIR/$BUNDLE exists already: choose another --bundle"
[[ -z "$FROM_S" || "$FROM_S" =~ $NUMBER ]] || die "--from-s \`$FROM_S\` is not a number of seconds"
[[ -z "$TO_S" || "$TO_S" =~ $NUMBER ]] || die "--to-s \`$TO_S\` is not a number of seconds"
[[ -z "$MAX_ROWS" || "$MAX_ROWS" =~ ^[1-9][0-9]*$ ]] || die "--max-rows \`$MAX_ROWS\` is not a whole number >= 1"
[[ "$SHARE" =~ $NUMBER ]] || die "--share \`$SHARE\` is not a number"
[[ -z "$MIN_RESOLVED" || "$MIN_RESOLVED" =~ ^[1-9][0-9]*$ ]] || die "--min-resolved \`$MIN_RESOLVED\` is not a whole number >= 1"
[[ -z "$MARGIN" || "$MARGIN" =~ $NUMBER ]] || die "--margin \`$MARGIN\` is not a number"
[[ -n "${ALLOCATOR_ADMIN_TOKEN:-}" ]] || die "ALLOCATOR_ADMIN_TOKEN is not set: the export is an admin route of the allocator"
[[ -n "${INFERENCE_ADMIN_TOKEN:-}" ]] || die "INFERENCE_ADMIN_TOKEN is not set: offering a canary is an admin route of the inference server"
command -v curl >/dev/null || die "curl is not installed"
VERSION="${VERSION:-$BUNDLE-$(date +%s)}"

# --- the binaries --------------------------------------------------------------------------------
if [[ -z "$BIN_DIR" ]]; then
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
    if [[ ! -x "$BIN_DIR/vmtrace" || ! -x "$BIN_DIR/lifetime-train" ]]; then
        say "building vmtrace and lifetime-train (release)"
        (cd "$ROOT" && cargo build --release -p traces -p lifetime-train --bins) \
            || die "building vmtrace and lifetime-train failed"
    fi
fi
for binary in vmtrace lifetime-train; do
    [[ -x "$BIN_DIR/$binary" ]] || die "$BIN_DIR/$binary is missing: build it with \`cargo build --release -p traces -p lifetime-train --bins\`"
done

if [[ -n "$WORK_DIR" ]]; then
    mkdir -p "$WORK_DIR" || die "cannot create --work-dir $WORK_DIR"
else
    WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/retrain.XXXXXX")"
    CLEAN_WORK=1
fi
STAGING=""
cleanup() {
    [[ -n "$STAGING" && -d "$STAGING" ]] && rm -rf "$STAGING"
    [[ -n "${CLEAN_WORK:-}" ]] && rm -rf "$WORK_DIR"
    return 0
}
trap cleanup EXIT

# curl with a bearer token that never appears on a command line (read as curl configuration).
curl_admin() {
    local token="$1"
    shift
    token="${token//\\/\\\\}"
    curl --silent --show-error --config <(printf 'header = "Authorization: Bearer %s"\n' "${token//\"/\\\"}") "$@"
}

# --- 1. the export -------------------------------------------------------------------------------
QUERY=""
for pair in "from_s=$FROM_S" "to_s=$TO_S" "max_rows=$MAX_ROWS"; do
    [[ -n "${pair#*=}" ]] && QUERY="$QUERY${QUERY:+&}$pair"
done
EXPORT="$WORK_DIR/export.csv"
say "1/5 downloading the export: $ALLOCATOR/v1/export${QUERY:+?$QUERY}"
status=$(curl_admin "$ALLOCATOR_ADMIN_TOKEN" --output "$EXPORT" --dump-header "$WORK_DIR/export.headers" \
    --write-out '%{http_code}' "$ALLOCATOR/v1/export${QUERY:+?$QUERY}") \
    || die "step 1 (export): the download from $ALLOCATOR failed or was cut off (curl exit $?); nothing was changed"
if [[ "$status" != 200 ]]; then
    die "step 1 (export): $ALLOCATOR answered $status: $(head -c 2000 "$EXPORT" 2>/dev/null)"
fi
header() { tr -d '\r' <"$WORK_DIR/export.headers" | awk -v name="$1" 'tolower($1) == name ":" { print $2 }' | tail -n 1; }
ROWS="$(header x-export-rows)"
[[ "$ROWS" =~ ^[0-9]+$ ]] || die "step 1 (export): the answer has no x-export-rows header: is $ALLOCATOR an allocator of this release?"
[[ "$ROWS" -gt 0 ]] || die "step 1 (export): no VM started in the window: nothing to train on"
[[ "$(header x-export-truncated)" != true ]] || warn "the window holds more VMs than --max-rows: the export has the earliest $ROWS"
say "    $ROWS VMs ($(wc -c <"$EXPORT") bytes) in $EXPORT"

# --- 2. the round trip ---------------------------------------------------------------------------
say "2/5 reading it back: vmtrace stats"
"$BIN_DIR/vmtrace" stats "$EXPORT" >"$WORK_DIR/stats.txt" 2>&1 \
    || die "step 2 (vmtrace stats): the export does not read as a trace: $(tail -n 3 "$WORK_DIR/stats.txt")"
sed 's/^/    /' "$WORK_DIR/stats.txt"
READ="$(awk '$1 == "VMs" { print $2 }' "$WORK_DIR/stats.txt")"
[[ "$READ" == "$ROWS" ]] || die "step 2 (vmtrace stats): read $READ VMs of the $ROWS the allocator sent"

# --- 3. training ---------------------------------------------------------------------------------
OUT="$WORK_DIR/bundle"
rm -rf "$OUT"
say "3/5 training bundle $BUNDLE (version $VERSION): lifetime-train ${TRAIN_ARGS[*]}"
"$BIN_DIR/lifetime-train" --train "$EXPORT" --out "$OUT" --name "$BUNDLE" --version "$VERSION" "${TRAIN_ARGS[@]}" \
    >"$WORK_DIR/train.log" 2>&1 \
    || die "step 3 (lifetime-train) failed: $(tail -n 5 "$WORK_DIR/train.log")"
[[ -f "$OUT/manifest.json" ]] || die "step 3 (lifetime-train) wrote no manifest.json in $OUT"

# --- 4. into the models directory, whole ---------------------------------------------------------
say "4/5 copying it to $MODELS_DIR/$BUNDLE"
# The server reads a directory as a bundle once it has a manifest.json (hidden names included). So
# the files go first into a hidden directory in the models directory itself, without the manifest
# (never a bundle), which is renamed into place (one step on one file system); the manifest comes
# last, written beside and renamed in: the bundle appears whole or not at all.
STAGING="$(mktemp -d "$MODELS_DIR/.retrain-$BUNDLE.XXXXXX")" || die "step 4 (copy): cannot write to $MODELS_DIR"
for file in "$OUT"/*; do
    [[ "$(basename "$file")" == manifest.json ]] && continue
    cp -R "$file" "$STAGING/" || die "step 4 (copy): copying $file into $STAGING failed"
done
chmod 755 "$STAGING"
[[ ! -e "$MODELS_DIR/$BUNDLE" ]] || die "step 4 (copy): $MODELS_DIR/$BUNDLE appeared meanwhile; left as it is"
mv -T "$STAGING" "$MODELS_DIR/$BUNDLE" || die "step 4 (copy): renaming $STAGING to $MODELS_DIR/$BUNDLE failed"
STAGING="$MODELS_DIR/$BUNDLE"
cp "$OUT/manifest.json" "$MODELS_DIR/$BUNDLE/.manifest.json.tmp" \
    && mv -T "$MODELS_DIR/$BUNDLE/.manifest.json.tmp" "$MODELS_DIR/$BUNDLE/manifest.json" \
    || die "step 4 (copy): writing $MODELS_DIR/$BUNDLE/manifest.json failed"
STAGING=""

# --- 5. the canary -------------------------------------------------------------------------------
say "5/5 offering it as a canary on $INFERENCE"
# The status object of our bundle in a GET/POST /v1/models answer (compact JSON; the canary alone has
# a nested object, and ours is no canary yet).
bundle_state() { grep -o "{\"bundle\":\"$BUNDLE\"[^{}]*}" "$1" | sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' | head -n 1; }
bundle_reason() { grep -o "{\"bundle\":\"$BUNDLE\"[^{}]*}" "$1" | sed -n 's/.*"reason":"\(.*\)".*/\1/p' | head -n 1; }
MODELS_JSON="$WORK_DIR/models.json"
deadline=$((SECONDS + 60))
while :; do
    status=$(curl_admin "$INFERENCE_ADMIN_TOKEN" --output "$MODELS_JSON" --write-out '%{http_code}' \
        -X POST "$INFERENCE/v1/models/reload") \
        || die "step 5 (rescan): $INFERENCE cannot be reached (curl exit $?); the bundle is in $MODELS_DIR/$BUNDLE"
    [[ "$status" == 200 ]] || die "step 5 (rescan): $INFERENCE answered $status: $(head -c 2000 "$MODELS_JSON")"
    state="$(bundle_state "$MODELS_JSON")"
    case "$state" in
        available | stable | canary) break ;;
        rejected) die "step 5 (rescan): the inference server rejected the bundle: $(bundle_reason "$MODELS_JSON")" ;;
        loading | "") ;;
        *) die "step 5 (rescan): the bundle is \`$state\`" ;;
    esac
    [[ $SECONDS -lt $deadline ]] || die "step 5 (rescan): the inference server does not list $BUNDLE as valid after 60 s (state \`${state:-absent}\`): does it serve $MODELS_DIR?"
    sleep 1
done
BODY="{\"bundle\":\"$BUNDLE\",\"share\":$SHARE"
[[ "$AUTO" == true ]] && BODY="$BODY,\"auto\":true"
[[ -n "$MIN_RESOLVED" ]] && BODY="$BODY,\"min_resolved\":$MIN_RESOLVED"
[[ -n "$MARGIN" ]] && BODY="$BODY,\"margin\":$MARGIN"
BODY="$BODY}"
status=$(curl_admin "$INFERENCE_ADMIN_TOKEN" --output "$MODELS_JSON" --write-out '%{http_code}' \
    -X POST -H 'content-type: application/json' --data "$BODY" "$INFERENCE/v1/models/canary") \
    || die "step 5 (canary): $INFERENCE cannot be reached (curl exit $?)"
[[ "$status" == 200 ]] || die "step 5 (canary): $INFERENCE answered $status to $BODY: $(head -c 2000 "$MODELS_JSON")"
say "offered $BUNDLE (version $VERSION, trained on $ROWS VMs) as a canary: $BODY"
