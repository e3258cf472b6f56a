# Sourced by the compare scripts (not run on its own).
#
# synth_model NAME FILE [ARGS...]: unless FILE exists, writes the synthetic
# model NAME (ARCH-SIZE, e.g. llama-1b) to FILE with `$infer synth` (Q4_K_M,
# or what ARGS, extra options of `infer synth`, ask for), giving
# Gemma 3 sizes the tokenizer of `$tokenizer` when it is set. Uses the
# caller's `log` and `die`.
synth_model() {
    local m="$1" f="$2"
    shift 2
    local arch="${m%%-*}" size="${m#*-}"
    [[ -s "$f" ]] && return 0
    local args=(synth --arch "$arch" --size "$size" -o "$f" "$@")
    [[ -n "${tokenizer:-}" && "$arch" == gemma3 ]] && args+=(--tokenizer-from "$tokenizer")
    log "$infer ${args[*]}"
    "$infer" "${args[@]}" >&2 || die "infer synth $m failed"
}
