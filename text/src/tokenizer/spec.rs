/// The tokenizer as GGUF metadata describes it (`tokenizer.ggml.*` keys), format-neutral.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp uses (`"smollm"`, `"llama-bpe"`, …).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores` (SentencePiece models).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges` (BPE models), each `"left right"`.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece models).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}
