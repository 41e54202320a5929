"""bench/peers/check_ember.py: the suite's check of peers_ember, the Ember side of bench/peers:
--init writes every workload's .npy files, and each workload's first two losses are the same
eager and compiled (within 1e-4 relative; the compiled add is one add a call, so it is checked
against itself only). Usage: check_ember.py PEERS_EMBER SCRATCH_DIR"""
import json
import os
import subprocess
import sys
import tempfile

exe = sys.argv[1]
with tempfile.TemporaryDirectory(dir=sys.argv[2] if len(sys.argv) > 2 else None) as d:
    subprocess.run([exe, "--init", d], check=True)
    for w in ["mlp", "lenet", "transformer", "softmax", "layer_norm", "add"]:
        names = open(os.path.join(d, w, "params.txt")).read().split()
        for n in names + ["in0"]:
            assert os.path.getsize(os.path.join(d, w, n + ".npy")) > 0, (w, n)
        out = {}
        for mode in ["eager", "compiled"]:
            r = subprocess.run([exe, "--workload", w, "--mode", mode, "--dir", d, "--steps", "1"],
                               capture_output=True, text=True)
            assert r.returncode == 0, f"{w} {mode}: {r.stderr}"
            out[mode] = json.loads(r.stdout.strip().splitlines()[-1])
            assert out[mode]["ms_per_step"] > 0 and out[mode]["peak_rss_mb"] > 0, out[mode]
        if w != "add":
            for k in ["loss1", "loss2"]:
                e, c = out["eager"][k], out["compiled"][k]
                assert abs(e - c) <= 1e-4 * max(1.0, abs(e)), f"{w} {k}: eager {e}, compiled {c}"
        print(f"{w}: eager {out['eager']['loss1']:.6g} -> {out['eager']['loss2']:.6g}, compiled "
              f"{out['compiled']['loss1']:.6g} -> {out['compiled']['loss2']:.6g}")
