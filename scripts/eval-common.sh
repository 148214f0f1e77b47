# Shared by scripts/validate.sh and scripts/evaluate.sh (sourced, from the repository's root): the
# data and model folders, the binaries they run, and `train NAME ARGS...`, which trains a model
# bundle into $MODELS/NAME with lifetime-train unless it is there already.
DATA=${DATA:-../shared/data}
MODELS=target/eval-models
cargo build --release -p simulator -p lifetime-train -p traces --bins

train() {
    local name=$1; shift
    if [ ! -f "$MODELS/$name/manifest.json" ]; then
        target/release/lifetime-train --out "$MODELS/$name" --name "$name" --version "$name-1" \
            --iterations 200 "$@"
    fi
}
