#include "core/blas.h"

namespace loco {

void set_blas_threads(int n) { openblas_set_num_threads(n); }
int blas_threads() { return openblas_get_num_threads(); }

}  // namespace loco
