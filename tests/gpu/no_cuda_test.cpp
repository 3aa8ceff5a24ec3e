// Built without the CUDA backend (TACHYON_CUDA=OFF or no nvcc): the gpu suite reports one skip.
#ifndef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

TEST(Cuda, SkippedWithoutCudaBackend) { GTEST_SKIP() << "built without the CUDA backend (TACHYON_CUDA)"; }

#endif
