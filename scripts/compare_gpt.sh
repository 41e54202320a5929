#!/usr/bin/env bash
# scripts/compare_gpt.sh GPT_BINARY: trains a small GPT on the fortunes corpus for 100 steps eagerly
# and with the whole step em_compile'd (inductor), and requires: every step's loss within 1e-4
# relative of eager's over the first 10 steps and 1e-3 after (the generated kernels sum in another
# order and run SLEEF's exp and tanh, so the runs drift apart slowly), the validation loss to fall
# below 0.95 of the unigram entropy of the corpus, and the --json file to hold the whole run.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--steps 100 --n-layer 2 --d-model 64 --block 32 --batch-size 16 --warmup 10 --eval-every 50 --eval-batches 2
      --gen-chars 40)
"$bin" "${args[@]}" --no-compile --no-compile-decode --loss-log "$dir/eager.txt" --json "$dir/eager.json" > "$dir/eager.out"
"$bin" "${args[@]}" --loss-log "$dir/compiled.txt" --json "$dir/compiled.json" > "$dir/compiled.out" 2> "$dir/compiled.err"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return [float.fromhex(l) for l in open(f"{d}/{name}.txt")]
e, c = losses("eager"), losses("compiled")
assert len(e) == len(c) == 100, (len(e), len(c))
for i, (a, b) in enumerate(zip(e, c)):
    tol = 1e-4 if i < 10 else 1e-3
    assert abs(a - b) <= tol * a, f"step {i}: eager {a!r}, compiled {b!r}"
for name in ("eager", "compiled"):
    j = json.load(open(f"{d}/{name}.json"))
    h = j["corpus"]["unigram_entropy_nats"]
    val = [v["loss"] for v in j["val"]]
    assert len(j["train_loss"]) == 100 and [v["step"] for v in j["val"]] == [0, 50, 100], j["val"]
    assert val[-1] < val[0] and val[-1] < 0.95 * h, f"{name}: val losses {val}, unigram entropy {h}"
    assert j["sample"].startswith("The meaning of life is ") and len(j["sample"]) == 23 + 40, j["sample"]
print(f"ok: 100 steps, compiled within {max(abs(a - b) / a for a, b in zip(e, c)):.1e} of eager; "
      f"val loss {val[0]:.3f} -> {val[-1]:.3f}, unigram entropy {h:.3f}")
PY
grep -q "em_compile(gpt_step): 100 calls, 2 traced, 97 replayed" "$dir/compiled.out" ||
  { echo "not ok: the compiled step was not traced once and replayed:"; grep "em_compile" "$dir/compiled.out"; exit 1; }
