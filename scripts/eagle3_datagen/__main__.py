"""`python -m eagle3_datagen`: the `eagle3-datagen` command (cli.py), without installing it."""

import sys

from eagle3_datagen.cli import main

sys.exit(main())
