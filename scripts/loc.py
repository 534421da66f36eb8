"""Lines per module of the compiler (a soft budget of ~400 per stage module; over means split by concept)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 400

rows = []
for p in sorted((ROOT / "aot").rglob("*.py")):
    n = sum(1 for line in p.read_text(encoding="utf-8").splitlines() if line.strip() and not line.strip().startswith("#"))
    rows.append((n, p.relative_to(ROOT)))
for n, p in rows:
    print(f"{n:6d}  {p}{'   (over budget)' if n > BUDGET else ''}")
print(f"{sum(n for n, _ in rows):6d}  total")
