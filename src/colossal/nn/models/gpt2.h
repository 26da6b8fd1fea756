// GPT-2 (Hugging Face transformers' GPT2LMHeadModel): token and position embeddings, pre-LN
// blocks with causal attention and a tanh-GELU MLP, a final LayerNorm and an output projection
// tied to the token embedding. Parameters carry the Hub's names without the "transformer."
// prefix (wte.weight, h.0.attn.c_attn.weight, ln_f.bias, ...) and Conv1D's [in, out] layout, so
// Hub checkpoints load through load_state_dict as they are, and initialisation is HF's.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "colossal/core/random.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/embedding.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/layer_view.h"

namespace colossal::nn::models {

struct GPT2Config {
  int64_t vocab_size = 50257;  ///< tokens the tokenizer produces; ids and targets are below it
  int64_t n_positions = 1024;  ///< the longest sequence (rows of wpe)
  int64_t n_embd = 768;        ///< hidden width
  int64_t n_layer = 12;        ///< transformer blocks
  int64_t n_head = 12;         ///< attention heads; must divide n_embd
  /// Dropout after the embeddings, on the attention probabilities and after each residual
  /// branch (HF's embd_pdrop, attn_pdrop and resid_pdrop, all 0.1 in the released models).
  double dropout = 0.1;
  double layer_norm_epsilon = 1e-5;
  /// Standard deviation of the normal initialisation (HF's initializer_range).
  double initializer_range = 0.02;
  /// Rows of wte (and columns of the logits) rounded up to a multiple of this: 64 turns 50257
  /// into 50304, which tensor cores and tensor-parallel splits handle better (nanoGPT,
  /// Megatron). 1 is no padding. The padding rows are ordinary trainable rows no target names;
  /// the softmax includes their logits and they learn to stay small, as in nanoGPT.
  int64_t vocab_multiple = 1;
  /// Recompute each block's activations in backward instead of keeping them (activation
  /// checkpointing: Hugging Face's gradient_checkpointing_enable(), Megatron's full recompute,
  /// model.options.checkpoint_activations). Only the blocks' inputs stay alive between forward and
  /// backward, for about a third more compute; the dropout generators are rewound so the
  /// recompute draws the forward's masks and losses and gradients are the same as without it.
  bool checkpoint_activations = false;

  /// vocab_size rounded up to a multiple of vocab_multiple.
  int64_t padded_vocab_size() const;
  /// The model's parameter count (tied wte counted once), computed without building it.
  int64_t num_parameters() const;
  /// Throws naming the field when a size is not positive, n_head does not divide n_embd, or a
  /// probability is outside [0, 1].
  void validate() const;

  static GPT2Config gpt2_124m();   ///< "gpt2": 12 layers, 768 wide, 12 heads
  static GPT2Config gpt2_350m();   ///< "gpt2-medium": 24 layers, 1024 wide, 16 heads
  static GPT2Config gpt2_774m();   ///< "gpt2-large": 36 layers, 1280 wide, 20 heads
  static GPT2Config gpt2_1558m();  ///< "gpt2-xl": 48 layers, 1600 wide, 25 heads
  /// From a Hugging Face config.json: vocab_size, n_positions, n_embd, n_layer, n_head,
  /// layer_norm_epsilon, initializer_range and the three *_pdrop (which must then agree); absent
  /// keys keep this struct's defaults. activation_function, when given, must be gelu_new (the tanh
  /// approximation, the only one GPT-2 uses).
  static GPT2Config from_json(std::string_view json);
};

/// HF's GPT2Attention: c_attn (Conv1D, n_embd -> 3 n_embd) -> causal multi-head attention ->
/// c_proj (Conv1D) -> resid_dropout.
class GPT2Attention : public Module {
 public:
  GPT2Attention(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator);
  /// x [B, T, n_embd] -> [B, T, n_embd].
  Tensor forward(const Tensor& x) override;
  /// residual + forward(x), the dropout and the residual add in one pass (ops::dropout_add).
  Tensor forward_add(const Tensor& x, const Tensor& residual);

  const std::shared_ptr<Conv1D>& c_attn() const { return c_attn_; }
  const std::shared_ptr<Conv1D>& c_proj() const { return c_proj_; }

 private:
  int64_t n_head_;
  double attn_dropout_;
  core::Generator* dropout_generator_;
  std::shared_ptr<Conv1D> c_attn_;
  std::shared_ptr<Conv1D> c_proj_;
  std::shared_ptr<Dropout> resid_dropout_;
};

/// HF's GPT2MLP: c_fc (n_embd -> 4 n_embd) -> gelu_new -> c_proj -> dropout; the first three run as
/// one ops::gelu_mlp (on the GPU, GEMMs whose epilogues apply GELU forward and its gradient).
class GPT2MLP : public Module {
 public:
  GPT2MLP(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator);
  Tensor forward(const Tensor& x) override;
  /// residual + forward(x), the dropout and the residual add in one pass (ops::dropout_add).
  Tensor forward_add(const Tensor& x, const Tensor& residual);

  const std::shared_ptr<Conv1D>& c_fc() const { return c_fc_; }
  const std::shared_ptr<Conv1D>& c_proj() const { return c_proj_; }

 private:
  std::shared_ptr<Conv1D> c_fc_;
  std::shared_ptr<Conv1D> c_proj_;
  std::shared_ptr<Dropout> dropout_;
};

/// HF's GPT2Block: x + attn(ln_1(x)), then + mlp(ln_2(.)); recomputed in backward while training
/// with checkpoint_activations on (GPT2Config::checkpoint_activations at construction).
class GPT2Block : public Module {
 public:
  GPT2Block(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator);
  Tensor forward(const Tensor& x) override;

  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }
  /// The generator every dropout of the block draws from (nullptr: core::default_generator()).
  core::Generator* dropout_generator() const { return dropout_generator_; }

  const std::shared_ptr<LayerNorm>& ln_1() const { return ln_1_; }
  const std::shared_ptr<GPT2Attention>& attn() const { return attn_; }
  const std::shared_ptr<LayerNorm>& ln_2() const { return ln_2_; }
  const std::shared_ptr<GPT2MLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<GPT2Attention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<GPT2MLP> mlp_;
  core::Generator* dropout_generator_;
  bool checkpoint_activations_;

  Tensor forward_block(const Tensor& x);
};

/// The language model. Initialised as HF's _init_weights: every weight N(0, initializer_range),
/// biases zero, LayerNorms one and zero, then the c_proj weights (the ones that write into the
/// residual stream) N(0, initializer_range / sqrt(2 n_layer)), as in the GPT-2 paper.
class GPT2 : public Module {
 public:
  /// generator draws the initial weights; dropout_generator (nullptr = core::default_generator())
  /// drives every dropout and must outlive the model.
  /// build: the pieces of layers() built at full size, the others as stand-ins (Note [Pieces
  /// built]); wte is built when the embedding or the head is.
  explicit GPT2(const GPT2Config& config, core::Generator* generator = nullptr,
                core::Generator* dropout_generator = nullptr, const PieceFilter& build = {});

  /// ids [B, T] (i32/i64, T <= n_positions) -> logits [B, T, padded_vocab_size()].
  Tensor forward(const Tensor& ids) override;
  /// The model as pieces for pipeline parallelism (Note [Pipeline layers]): "embed" (ids ->
  /// hidden: wte, wpe, drop), one piece per block h.<i>, and "head" (hidden -> logits: ln_f and
  /// the tied wte, which therefore appears in the first piece and the last).
  std::vector<std::shared_ptr<Module>> layers();

  /// Every block's activation checkpointing on or off (and config().checkpoint_activations); what
  /// Hugging Face's gradient_checkpointing_enable() and _disable() do.
  void set_checkpoint_activations(bool on);

  const GPT2Config& config() const { return config_; }
  const std::shared_ptr<Embedding>& wte() const { return wte_; }
  const std::shared_ptr<Embedding>& wpe() const { return wpe_; }
  const std::shared_ptr<ModuleList>& h() const { return h_; }
  const std::shared_ptr<LayerNorm>& ln_f() const { return ln_f_; }

 private:
  GPT2Config config_;
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<ModuleList> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

/// The language-modelling loss: mean cross-entropy of logits [B, T, V] against targets [B, T]
/// (i32/i64), over every position whose target is not ignore_index. No shift: the targets are
/// already the next tokens (the data pipeline shifts), as in llm.c.
Tensor lm_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace colossal::nn::models
