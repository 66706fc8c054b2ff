# Sourced by run.sh and bundle.sh: the check phase's GPT-2 124M step, run on the GPU in bf16 and
# fp32 and on the host backend in fp32 (the reference, which bundle.sh can make beforehand).
# shellcheck disable=SC2034
check_step=(--model gpt2-124m -b 16 --seq-len 1024 --steps 2 --seed 7 --mode resident)
