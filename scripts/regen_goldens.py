"""Rebuild the golden packages in generated/ from examples/ (the one way to update them).

    python scripts/regen_goldens.py [name ...]

Writes only files whose content changed, removes files the build no longer produces and
prints what changed. Review the diff and commit it with a reason.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["sine_mlp", "addition_transformer"]


def build_examples(outdir: Path, names=None) -> list[Path]:
    """Build each example's programs into outdir; returns the project folders."""
    sys.path.insert(0, str(ROOT))
    from aot.pipeline import build
    from aot.cli import load_programs

    paths = []
    for name in names or EXAMPLES:
        src = ROOT / "examples" / f"{name}.py"
        for prog in load_programs(str(src)).values():
            paths.append(build(prog, outdir, source_name=src.name))
    return paths


def tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("names", nargs="*", help=f"examples to rebuild (default: {' '.join(EXAMPLES)})")
    args = ap.parse_args()
    gen = ROOT / "generated"
    with tempfile.TemporaryDirectory() as tmp:
        fresh = build_examples(Path(tmp), args.names)
        changed = []
        for proj in fresh:
            dst = gen / proj.name
            new, old = tree(proj), tree(dst) if dst.exists() else {}
            for rel, p in new.items():
                if rel not in old or not filecmp.cmp(p, old[rel], shallow=False):
                    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(p, dst / rel)
                    changed.append(f"{proj.name}/{rel}")
            for rel in set(old) - set(new):
                old[rel].unlink()
                changed.append(f"{proj.name}/{rel} (removed)")
    for c in changed:
        print(f"updated generated/{c}")
    if not changed:
        print("generated/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
