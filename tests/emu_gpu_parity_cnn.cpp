/* The CUDA emulation build of tests/gpu_parity_cnn.cu (compiled as C++ against cuda/emu/). */
#include "gpu_parity_cnn.cu"
