"""Train on the reverse task and print the held-out exact match (``spec.demo``, issue 11).

    python -m impl_tf.train_demo [--steps N] [--batch B] [--seed S] [--out run.json] [--min-accuracy 0.99]
"""

import sys

import impl_tf
from spec import demo

if __name__ == "__main__":
    demo.main(impl_tf, sys.argv[1:])
