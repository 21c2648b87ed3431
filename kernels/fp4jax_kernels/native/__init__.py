"""Native block-scaled FP4 GEMM on Blackwell (sm_100+): our bit-exact codes and scales fed to the hardware path."""
