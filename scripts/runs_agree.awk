# scripts/runs_agree.awk: compares two fashion_mnist --json epoch lines, a (the reference) and
# b: exits 0 when b's train_loss is within rel * a's (relative) and its test_accuracy within acc
# (absolute). Use: awk -v a="$line1" -v b="$line2" -v rel=1e-3 -v acc=0.01 -f runs_agree.awk
function field(s, k) {
  match(s, "\"" k "\": [0-9.eE+-]+")
  return substr(s, RSTART + length(k) + 4, RLENGTH - length(k) - 4) + 0
}
BEGIN {
  la = field(a, "train_loss"); lb = field(b, "train_loss")
  aa = field(a, "test_accuracy"); ab = field(b, "test_accuracy")
  d = la - lb; if (d < 0) d = -d
  e = aa - ab; if (e < 0) e = -e
  exit !(la > 0 && d <= rel * la && e <= acc)
}
