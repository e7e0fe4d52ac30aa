/* CUDA emulation build: cuda/attention_cudnn.cpp's refusals (the emulation has no cuDNN; its
 * twin of the fused attention is the flash kernels), so the backend calls the same functions in
 * both builds. */
#include "../attention_cudnn.cpp"
