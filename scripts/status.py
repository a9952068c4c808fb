"""How far the run in this directory is, per category and shard: `python scripts/status.py [--watch]`,
as `eagle3-datagen status` (the installed command) does."""

import sys

from eagle3_datagen.steps.status import main

sys.exit(main())
