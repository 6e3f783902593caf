"""``python -m attnfuzz``: the ``attnfuzz`` command."""

import sys

from attnfuzz.harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
