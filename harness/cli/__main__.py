"""``python -m attnfuzz.harness.cli``: the ``attnfuzz`` command."""

import sys

from attnfuzz.harness.cli import main  # signals while it loads: quiet (see there)

if __name__ == "__main__":
    sys.exit(main())
