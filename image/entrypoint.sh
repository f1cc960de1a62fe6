#!/bin/sh
# Entrypoint of the derived image: prove the baked files are the ones we built, clear the CPU-KV
# mmaps a dead EngineCore could not unlink (~103 GB each), then hand the process to vLLM.
set -eu
/usr/local/bin/bakery-selfcheck
find /dev/shm -maxdepth 1 -type f -name 'vllm_offload_*.mmap' -delete
exec vllm serve "$@"
