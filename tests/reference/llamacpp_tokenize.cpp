// llama.cpp's own tokenizer over many texts, for tests/reference/gguf_tokenize.py: loads a GGUF's
// vocabulary only (no weights) and tokenizes each NUL-separated text of stdin as llama_tokenize does
// with add_special = false and parse_special = true (special tokens in the text are recognised, as a
// tokenizer.json's added tokens are; no BOS or EOS is added). Prints one line per text: its ids.
// First line: "add_bos <0|1> bos <id>", llama.cpp's BOS policy for the vocabulary.
//
// Build: g++ -O2 -std=c++17 llamacpp_tokenize.cpp -I LLAMA/include -I LLAMA/ggml/include \
//            -L LLAMA/build/bin -lllama -Wl,-rpath,LLAMA/build/bin -o llamacpp_tokenize
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf < texts (NUL-separated)\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], params);
    if (model == nullptr) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::printf("add_bos %d bos %d\n", llama_vocab_get_add_bos(vocab) ? 1 : 0, llama_vocab_bos(vocab));
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    size_t start = 0;
    std::vector<llama_token> ids;
    while (start < input.size()) {
        size_t end = input.find('\0', start);
        if (end == std::string::npos) end = input.size();
        const std::string text = input.substr(start, end - start);
        ids.resize(text.size() + 16);
        int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, true);
        if (n < 0) {
            ids.resize(-n);
            n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, true);
        }
        for (int i = 0; i < n; i++) std::printf(i ? " %d" : "%d", ids[i]);
        std::printf("\n");
        start = end + 1;
    }
    llama_model_free(model);
    return 0;
}
