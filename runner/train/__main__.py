import sys

from runner.train.trainer import main

sys.exit(main())
