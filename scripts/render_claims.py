#!/usr/bin/env python
"""Print, write or check docs/claims.md, rendered from the ledger data (transformer_np/data/claims.json).

    python scripts/render_claims.py [--write | --check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformer_np.course.ledger import CLAIMS_MD, render_markdown


def main(argv=None) -> int:
    """Print (default), write or check docs/claims.md."""
    ap = argparse.ArgumentParser(prog="python scripts/render_claims.py", description=__doc__.strip().split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {CLAIMS_MD}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {CLAIMS_MD} is not what the data renders")
    args = ap.parse_args(argv)
    text = render_markdown()
    if args.write:
        CLAIMS_MD.write_text(text, encoding="utf-8")
        print(f"wrote {CLAIMS_MD}")
    elif args.check:
        same = CLAIMS_MD.is_file() and CLAIMS_MD.read_text(encoding="utf-8") == text
        print(f"{CLAIMS_MD}: {'up to date' if same else 'differs from the ledger data: run --write'}")
        return 0 if same else 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
