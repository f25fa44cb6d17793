"""Credit-quality benchmark: ``python bench/credit_quality.py [--p 0,0.2,0.4] [--seeds 5]``.

Same as ``draco-gym bench credit``. The simulation lives in the installed package
(``draco_gym.algos.credit.quality``) so that the CLI finds it from any directory; this script
is the entry point the bench/ folder promises.
"""

import sys

from draco_gym.algos.credit.quality import main

if __name__ == "__main__":
    sys.exit(main())
