export CUDA_HOME=/usr/local/cuda-13.0
export PATH=/usr/local/cuda-13.0/bin:$PATH
export PYTORCH_NVCC=/work/fa3build/nvccwrap.sh
export CXX=/work/fa3build/cxxwrap.sh
export MAX_JOBS=2 NVCC_THREADS=1
export TORCH_CUDA_ARCH_LIST=9.0a
export FLASH_ATTENTION_FORCE_BUILD=TRUE
export FLASH_ATTENTION_OFFLINE_BUILD=1
for f in FP8 SOFTCAP PACKGQA SM80 HDIM96 HDIM192 HDIM256 HDIMDIFF64 HDIMDIFF192; do export FLASH_ATTENTION_DISABLE_$f=TRUE; done
