"""``python -m serve_app.cli``: the same entry point as ``agent-service``."""

import sys

from serve_app.cli import main

sys.exit(main())
