"""Write the golden test vectors (``spec.golden_recipes``) to spec/golden/, or check them against a regeneration.

    python -m tools.golden            # (re)write spec/golden/
    python -m tools.golden --check    # regenerate in a temp dir, compare with the committed files

The check passes a file with the same bytes, or one that differs by float64 noise only (another CPU's kernels:
``golden_recipes.check``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from spec.golden_cases import GOLDEN_DIR
from spec.golden_recipes import check, generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="regenerate in a temp dir and compare")
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    args = parser.parse_args(argv)
    if args.check:
        differ = check(args.out)
        for f in differ:
            print(f"differs: {f}")
        print(f"golden check: {len(differ)} file(s) differ" if differ else
              "golden check: every file reproduced (bit for bit or up to float64 noise)")
        return 1 if differ else 0
    shutil.rmtree(args.out, ignore_errors=True)
    generate(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {len(list(args.out.iterdir()))} cases to {args.out} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
