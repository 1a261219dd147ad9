#!/usr/bin/env bash
# On the H200 device machine: install the carried wheels, then run one stage.
#   bash benchmarks/run_h200.sh STAGE...   (STAGE: tests, tests-1, tests-2, gpu-tests, prepare, bench-small, bench-1b, bench-8b, e2e, ipc, gemv, tp, tp-decode)
# tests: the whole suite on the GPU (about 8 min: run it alone in one call, or as tests-1 and
# tests-2, about 4 min each); bench-small: prepare_inputs,
# attention, 1B decode (about 4 min); bench-8b: 8B decode, end to end (about 3 min).
# Logs and JSON summaries go to $OUT (the device tool brings them back).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TPRUN_CACHE=/tmp/tprun-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
for stage in "${@:-tests}"; do
case "$stage" in
  tests)
    timeout 570 python3 -m pytest -q -p no:cacheprovider --durations=15 2>&1 | tee "$OUT/pytest_gpu.log"
    ;;
  tests-1|tests-2)
    # The whole suite in two halves (by file name), each well inside one call.
    if [ "$stage" = tests-1 ]; then files=$(ls tests/test_[a-l]*.py); else files=$(ls tests/test_[m-z]*.py); fi
    timeout 400 python3 -m pytest -q -p no:cacheprovider --durations=10 $files 2>&1 \
      | tee "$OUT/pytest_gpu_$stage.log" | tail -25
    ;;
  gpu-tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_layer_kernels.py \
      tests/test_model_parity.py -k "cuda or Triton or triton or rms or rotary or silu" \
      2>&1 | tail -5 | tee "$OUT/pytest_gpu_kernels.log"
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py \
      tests/test_gpu_no_sync.py tests/test_sampler.py tests/test_input_kernels_padded_rows.py \
      tests/test_runner_graph_path.py tests/test_runner_slot_reuse.py tests/test_triton_attention.py \
      2>&1 | tail -5 | tee -a "$OUT/pytest_gpu_kernels.log"
    ;;
  e2e)
    timeout 280 python3 benchmarks/bench_e2e.py --shape 8b --out "$OUT/e2e_8b.json" 2>&1 | grep -v "capturing CUDA" | tee "$OUT/e2e_8b.log" | tail -1
    ;;
  ipc)
    timeout 240 python3 benchmarks/bench_ipc.py --out "$OUT/ipc.json" 2>&1 | tee "$OUT/ipc.log" | tail -30
    ;;
  tp|tp-decode)
    # Several GPUs (issue 8). tp: agreement and speed (async on/off) at every TP
    # size the host has (about 6 min at 8B on 8 GPUs); tp-decode: the decode step
    # per rank under torchrun, NCCL all-reduce inside, with a kernel table.
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
    sizes=$(for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && echo -n "$n "; done)
    if [ "$stage" = tp ]; then
      timeout 560 python3 benchmarks/bench_tp.py --shape 8b --tp $sizes --output-len 64 \
        --out "$OUT/tp_8b.json" 2>&1 | grep -v "capturing CUDA" | tee "$OUT/tp_8b.log" | tail -1
    else
      for n in $sizes; do
        [ "$n" -gt 1 ] || continue
        timeout 180 python3 -m torch.distributed.run --nproc-per-node "$n" benchmarks/bench_decode.py --shape 8b \
          --batches 1 8 32 64 128 --contexts 512 4096 --kernel-table \
          --out "$OUT/decode_8b_tp$n.json" >> "$OUT/decode_8b_tp.log" 2>&1
        tail -1 "$OUT/decode_8b_tp.log" | cut -c1-300
      done
    fi
    ;;
  gemv)
    timeout 200 python3 benchmarks/bench_gemv.py --out "$OUT/gemv.json" 2>&1 | tee "$OUT/gemv.log" | tail -14
    ;;
  prepare)
    timeout 60 python3 benchmarks/bench_prepare_inputs.py 2>&1 | tee "$OUT/prepare_inputs.log"
    ;;
  bench-small)
    timeout 60 python3 benchmarks/bench_prepare_inputs.py 2>&1 | tee "$OUT/prepare_inputs.log"
    timeout 200 python3 benchmarks/bench_attention.py --out "$OUT/attention.json" 2>&1 | tail -60 | tee "$OUT/attention.log"
    timeout 240 python3 benchmarks/bench_decode.py --shape 1b --batches 1 8 32 128 256 \
      --contexts 512 4096 --idle --out "$OUT/decode_1b.json" 2>&1 | tee "$OUT/decode_1b.log"
    ;;
  bench-1b)
    timeout 240 python3 benchmarks/bench_decode.py --shape 1b --batches 1 8 32 128 256 \
      --contexts 512 4096 --idle --out "$OUT/decode_1b.json" 2>&1 | tee "$OUT/decode_1b.log" | tail -1
    ;;
  bench-8b)
    timeout 280 python3 benchmarks/bench_decode.py --shape 8b --batches 1 8 32 64 128 256 \
      --contexts 512 4096 --idle --profile-host --kernel-table --out "$OUT/decode_8b.json" > "$OUT/decode_8b.log" 2> "$OUT/decode_8b.err"; tail -3 "$OUT/decode_8b.log"
    timeout 280 python3 benchmarks/bench_e2e.py --shape 8b --out "$OUT/e2e_8b.json" 2>&1 | tee "$OUT/e2e_8b.log"
    ;;
esac
done
