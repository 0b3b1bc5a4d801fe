"""``python -m local_world``: start twin (8101), sensor (8102) and optionally the scripted LLM."""

import sys

from local_world.servers import main

sys.exit(main())
