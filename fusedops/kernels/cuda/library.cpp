// The fusedops_cuda operator namespace, claimed once per process (TORCH_LIBRARY). It defines no
// function: each op's <op>_bindings.cpp adds its own with TORCH_LIBRARY_FRAGMENT and
// TORCH_LIBRARY_IMPL, and build.py compiles every *_bindings.cpp it finds.
#include <torch/library.h>

TORCH_LIBRARY(fusedops_cuda, m) { static_cast<void>(m); }
