/*
 * llama-logits: reference logits from llama.cpp, in the layout of
 * testdata/README.md (pNN.json + pNN.last_logits.f32).
 *
 * Usage: llama-logits MODEL.gguf PROMPTS.txt OUT_DIR [--kv f16|f32]
 *                     [--greedy N] [--threads N] [--follow IDS.txt]
 *
 * For every line of PROMPTS.txt (a prompt, "\n" written as backslash-n) it
 * tokenizes the prompt with the model's vocabulary (BOS as the vocabulary
 * says, special tokens parsed), evaluates it one token at a time (so every
 * position's logits come from a decode step, as in teacher forcing), then
 * takes N greedy steps. It writes, per prompt NN (from 00):
 *   pNN.json: {"prompt", "prompt_ids", "prompt_top": [{ids, logits}] per
 *              prompt position (top 20 next-token ids and logits),
 *              "greedy": [{id, piece, next_top}] }
 *   pNN.last_logits.f32: every logit at the last prompt position (f32 LE).
 * The KV cache type is f16 (llama.cpp's default) unless --kv f32; flash
 * attention is off.
 *
 * --follow IDS.txt: line k of IDS.txt (token ids separated by spaces) gives
 * the tokens fed after prompt k instead of the argmax, one step per id
 * (--greedy is then unused): another run's greedy tokens, so that two runs
 * (a quantized file and its F32 weights) can be compared position by
 * position on the same tokens. The "greedy" entries hold the fed ids.
 */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOP_K 20

static void die(const char *msg, const char *arg) {
    fprintf(stderr, "llama-logits: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(1);
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

/* The k largest logits, ids in descending order of logit (ties: lower id first). */
static void top_k(const float *logits, int n_vocab, int k, int *ids) {
    for (int j = 0; j < k; j++) ids[j] = -1;
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i];
        int pos = k;
        while (pos > 0 && (ids[pos - 1] < 0 || logits[ids[pos - 1]] < v)) pos--;
        if (pos >= k) continue;
        memmove(ids + pos + 1, ids + pos, (size_t) (k - pos - 1) * sizeof(int));
        ids[pos] = i;
    }
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t len = s[0] < 0x80 ? 1 : (s[0] >> 5) == 0x6 ? 2 : (s[0] >> 4) == 0xe ? 3 : (s[0] >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* A JSON string; bytes that are not valid UTF-8 (a byte token's piece)
 * are written as U+FFFD, so the file stays valid JSON. */
static void write_json_string(FILE *f, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *) s;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t len = utf8_len(u + i, n - i);
        if (len == 0) { fputs("\ufffd", f); i++; continue; }
        if (len > 1) { fwrite(u + i, 1, len, f); i += len; continue; }
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
        i++;
    }
    fputc('"', f);
}

static void write_top(FILE *f, const float *logits, int n_vocab) {
    int ids[TOP_K];
    int k = n_vocab < TOP_K ? n_vocab : TOP_K;
    top_k(logits, n_vocab, k, ids);
    fputs("{\"ids\":[", f);
    for (int j = 0; j < k; j++) fprintf(f, "%s%d", j ? "," : "", ids[j]);
    fputs("],\"logits\":[", f);
    for (int j = 0; j < k; j++) fprintf(f, "%s%.9g", j ? "," : "", logits[ids[j]]);
    fputs("]}", f);
}

static int argmax(const float *logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Decodes one token at position pos; returns its logits. */
static const float *step(struct llama_context *ctx, llama_token tok) {
    struct llama_batch b = llama_batch_get_one(&tok, 1);
    if (llama_decode(ctx, b) != 0) die("llama_decode failed", NULL);
    const float *l = llama_get_logits_ith(ctx, -1);
    if (!l) die("no logits", NULL);
    return l;
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: llama-logits MODEL.gguf PROMPTS.txt OUT_DIR [--kv f16|f32] [--greedy N] [--threads N] [--follow IDS.txt]", NULL);
    const char *model_path = argv[1], *prompts_path = argv[2], *out_dir = argv[3];
    enum ggml_type kv = GGML_TYPE_F16;
    int n_greedy = 48, n_threads = 2;
    const char *follow_path = NULL;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "f16")) kv = GGML_TYPE_F16;
            else if (!strcmp(argv[i], "f32")) kv = GGML_TYPE_F32;
            else die("--kv takes f16 or f32", argv[i]);
        } else if (!strcmp(argv[i], "--greedy") && i + 1 < argc) {
            n_greedy = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--follow") && i + 1 < argc) {
            follow_path = argv[++i];
        } else {
            die("unknown argument", argv[i]);
        }
    }
    if (n_greedy < 0 || n_threads < 1) die("bad --greedy or --threads", NULL);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load", model_path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    FILE *pf = fopen(prompts_path, "r");
    if (!pf) die("cannot open", prompts_path);
    FILE *ff = NULL;
    if (follow_path && !(ff = fopen(follow_path, "r"))) die("cannot open", follow_path);
    static char follow_line[65536];
    llama_token follow[4096];
    char line[65536];
    int n_case = 0;
    float *last = malloc(sizeof(float) * (size_t) n_vocab);
    if (!last) die("out of memory", NULL);
    while (fgets(line, sizeof line, pf)) {
        size_t len = strcspn(line, "\n");
        line[len] = 0;
        if (len == 0) continue;
        /* Unescape backslash-n. */
        char text[65536];
        size_t tl = 0;
        for (size_t i = 0; i < len; i++) {
            if (line[i] == '\\' && line[i + 1] == 'n') { text[tl++] = '\n'; i++; }
            else text[tl++] = line[i];
        }
        text[tl] = 0;
        llama_token toks[8192];
        int n_tok = llama_tokenize(vocab, text, (int32_t) tl, toks, 8192, true, true);
        if (n_tok <= 0) die("tokenization failed for", line);
        int n_follow = -1;
        if (ff) {
            if (!fgets(follow_line, sizeof follow_line, ff)) die("--follow file has fewer lines than prompts", NULL);
            n_follow = 0;
            for (char *p = follow_line, *end; n_follow < 4096; p = end) {
                long v = strtol(p, &end, 10);
                if (end == p) break;
                follow[n_follow++] = (llama_token) v;
            }
            n_greedy = n_follow;
        }

        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) (n_tok + n_greedy + 16);
        cp.n_batch = cp.n_ctx;
        cp.n_ubatch = cp.n_ctx;
        cp.n_threads = n_threads;
        cp.n_threads_batch = n_threads;
        cp.type_k = kv;
        cp.type_v = kv;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.swa_full = true;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) die("cannot create a context", NULL);

        char path[4096];
        snprintf(path, sizeof path, "%s/p%02d.json", out_dir, n_case);
        FILE *f = fopen(path, "w");
        if (!f) die("cannot write", path);
        fputs("{\"prompt\":", f);
        write_json_string(f, text, tl);
        fputs(",\"prompt_ids\":[", f);
        for (int i = 0; i < n_tok; i++) fprintf(f, "%s%d", i ? "," : "", toks[i]);
        fputs("],\"prompt_top\":[", f);
        const float *l = NULL;
        for (int i = 0; i < n_tok; i++) {
            l = step(ctx, toks[i]);
            if (i) fputc(',', f);
            write_top(f, l, n_vocab);
        }
        memcpy(last, l, sizeof(float) * (size_t) n_vocab);
        fputs("],\"greedy\":[", f);
        for (int g = 0; g < n_greedy; g++) {
            llama_token id = n_follow >= 0 ? follow[g] : argmax(l, n_vocab);
            char piece[256];
            int np = llama_token_to_piece(vocab, id, piece, sizeof piece, 0, true);
            if (np < 0) np = 0;
            l = step(ctx, id);
            fprintf(f, "%s{\"id\":%d,\"piece\":", g ? "," : "", id);
            write_json_string(f, piece, (size_t) np);
            fputs(",\"next_top\":", f);
            write_top(f, l, n_vocab);
            fputc('}', f);
        }
        fputs("]}\n", f);
        if (fclose(f) != 0) die("write failed", path);

        snprintf(path, sizeof path, "%s/p%02d.last_logits.f32", out_dir, n_case);
        FILE *lf = fopen(path, "wb");
        if (!lf || fwrite(last, sizeof(float), (size_t) n_vocab, lf) != (size_t) n_vocab || fclose(lf) != 0)
            die("write failed", path);
        llama_free(ctx);
        n_case++;
    }
    fclose(pf);
    if (ff) fclose(ff);
    free(last);
    llama_model_free(model);
    fprintf(stderr, "llama-logits: %d prompts, %d tokens of vocabulary\n", n_case, n_vocab);
    return n_case > 0 ? 0 : 1;
}
