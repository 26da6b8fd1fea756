// GPT-2: configuration presets and parsing, the block structure under HF's names, HF's
// initialisation, the tied output projection and the pipeline pieces.
#include "colossal/nn/models/gpt2.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/nn/attention.h"         // multihead_attention
#include "colossal/nn/init.h"              // normal_
#include "colossal/ops/elementwise.h"      // add
#include "colossal/ops/linalg.h"           // linear, gelu_mlp
#include "colossal/ops/nn_functional.h"    // cross_entropy

namespace colossal::nn::models {

// ---- GPT2Config

int64_t GPT2Config::padded_vocab_size() const {
  return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
}

int64_t GPT2Config::num_parameters() const {
  validate();
  const int64_t c = n_embd;
  // Per block: two LayerNorms (4c), c_attn (3c^2 + 3c), attn.c_proj (c^2 + c), c_fc (4c^2 + 4c),
  // mlp.c_proj (4c^2 + c).
  const int64_t per_block = 12 * c * c + 13 * c;
  return padded_vocab_size() * c + n_positions * c + n_layer * per_block + 2 * c;
}

void GPT2Config::validate() const {
  COLOSSAL_CHECK(vocab_size > 0 && n_positions > 0 && n_embd > 0 && n_layer > 0 && n_head > 0,
                 "GPT2Config: vocab_size ({}), n_positions ({}), n_embd ({}), n_layer ({}) and n_head ({}) must all "
                 "be positive",
                 vocab_size, n_positions, n_embd, n_layer, n_head);
  COLOSSAL_CHECK(n_embd % n_head == 0, "GPT2Config: n_head {} must divide n_embd {}", n_head, n_embd);
  COLOSSAL_CHECK(vocab_multiple > 0, "GPT2Config: vocab_multiple must be positive (1 = no padding), got {}",
                 vocab_multiple);
  COLOSSAL_CHECK(dropout >= 0.0 && dropout <= 1.0, "GPT2Config: dropout must be in [0, 1], got {}", dropout);
  COLOSSAL_CHECK(layer_norm_epsilon > 0.0, "GPT2Config: layer_norm_epsilon must be positive, got {}",
                 layer_norm_epsilon);
  COLOSSAL_CHECK(initializer_range > 0.0, "GPT2Config: initializer_range must be positive, got {}", initializer_range);
}

namespace {
GPT2Config preset(int64_t n_layer, int64_t n_embd, int64_t n_head) {
  GPT2Config config;
  config.n_layer = n_layer;
  config.n_embd = n_embd;
  config.n_head = n_head;
  return config;
}
}  // namespace

GPT2Config GPT2Config::gpt2_124m() {
  return preset(12, 768, 12);
}
GPT2Config GPT2Config::gpt2_350m() {
  return preset(24, 1024, 16);
}
GPT2Config GPT2Config::gpt2_774m() {
  return preset(36, 1280, 20);
}
GPT2Config GPT2Config::gpt2_1558m() {
  return preset(48, 1600, 25);
}

GPT2Config GPT2Config::from_json(std::string_view json) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1E400
    COLOSSAL_FAIL("GPT2Config::from_json: not valid JSON: {}", e.what());
  }
  COLOSSAL_CHECK(parsed.is_object(), "GPT2Config::from_json: expected a JSON object, got {}", parsed.type_name());
  GPT2Config config;
  auto read_int = [&](const char* key, int64_t& field) {
    if (!parsed.contains(key)) return;
    COLOSSAL_CHECK(parsed[key].is_number_integer(), "GPT2Config::from_json: '{}' must be an integer, got {}", key,
                   parsed[key].dump());
    field = parsed[key].get<int64_t>();
  };
  auto read_double = [&](const char* key, double& field) {
    if (!parsed.contains(key)) return;
    COLOSSAL_CHECK(parsed[key].is_number(), "GPT2Config::from_json: '{}' must be a number, got {}", key,
                   parsed[key].dump());
    field = parsed[key].get<double>();
  };
  read_int("vocab_size", config.vocab_size);
  read_int("n_positions", config.n_positions);
  read_int("n_embd", config.n_embd);
  read_int("n_layer", config.n_layer);
  read_int("n_head", config.n_head);
  read_double("layer_norm_epsilon", config.layer_norm_epsilon);
  read_double("initializer_range", config.initializer_range);
  bool have_dropout = false;
  for (const char* key : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) {
    if (!parsed.contains(key)) continue;
    double value = 0.0;
    read_double(key, value);
    COLOSSAL_CHECK(!have_dropout || value == config.dropout,
                   "GPT2Config::from_json: colossal's GPT-2 has one dropout probability, but embd_pdrop, attn_pdrop "
                   "and resid_pdrop differ ({} is {}, an earlier one {})",
                   key, value, config.dropout);
    config.dropout = value;
    have_dropout = true;
  }
  if (parsed.contains("activation_function")) {
    COLOSSAL_CHECK(parsed["activation_function"] == "gelu_new",
                   "GPT2Config::from_json: activation_function {} is not supported; GPT-2 uses gelu_new (tanh)",
                   parsed["activation_function"].dump());
  }
  if (parsed.contains("n_inner") && !parsed["n_inner"].is_null()) {
    COLOSSAL_CHECK(parsed["n_inner"] == 4 * config.n_embd,
                   "GPT2Config::from_json: n_inner {} is not supported; the MLP is 4 * n_embd = {} wide",
                   parsed["n_inner"].dump(), 4 * config.n_embd);
  }
  config.validate();
  return config;
}

// ---- blocks

GPT2Attention::GPT2Attention(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator)
    : Module("GPT2Attention"),
      n_head_(config.n_head),
      attn_dropout_(config.dropout),
      dropout_generator_(dropout_generator) {
  c_attn_ = register_module("c_attn", std::make_shared<Conv1D>(config.n_embd, 3 * config.n_embd, generator));
  c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(config.n_embd, config.n_embd, generator));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(config.dropout, dropout_generator));
}

Tensor GPT2Attention::forward(const Tensor& x) {
  const Tensor attended = multihead_attention(c_attn_->forward(x), n_head_, /*causal=*/true, attn_dropout_,
                                              is_training(), dropout_generator_);
  return resid_dropout_->forward(c_proj_->forward(attended));
}

Tensor GPT2Attention::forward_add(const Tensor& x, const Tensor& residual) {
  const Tensor attended = multihead_attention(c_attn_->forward(x), n_head_, /*causal=*/true, attn_dropout_,
                                              is_training(), dropout_generator_);
  return resid_dropout_->forward_add(c_proj_->forward(attended), residual);
}

GPT2MLP::GPT2MLP(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator)
    : Module("GPT2MLP") {
  c_fc_ = register_module("c_fc", std::make_shared<Conv1D>(config.n_embd, 4 * config.n_embd, generator));
  c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(4 * config.n_embd, config.n_embd, generator));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(config.dropout, dropout_generator));
}

Tensor GPT2MLP::forward(const Tensor& x) {
  // Conv1D's weight is [in, out]; gelu_mlp takes [out, in], and reads the transposed views as
  // transpose flags rather than copies. One op, so that its backward can fuse the GELU gradient into
  // a GEMM (see Note [Fused GELU backward] in ops/linalg.cpp).
  const Tensor out = ops::gelu_mlp(x, c_fc_->weight().t(), c_fc_->bias(), c_proj_->weight().t(), c_proj_->bias());
  return dropout_->forward(out);
}

Tensor GPT2MLP::forward_add(const Tensor& x, const Tensor& residual) {
  return dropout_->forward_add(
      ops::gelu_mlp(x, c_fc_->weight().t(), c_fc_->bias(), c_proj_->weight().t(), c_proj_->bias()), residual);
}

GPT2Block::GPT2Block(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator)
    : Module("GPT2Block"),
      dropout_generator_(dropout_generator),
      checkpoint_activations_(config.checkpoint_activations) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon));
  attn_ = register_module("attn", std::make_shared<GPT2Attention>(config, generator, dropout_generator));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon));
  mlp_ = register_module("mlp", std::make_shared<GPT2MLP>(config, generator, dropout_generator));
}

Tensor GPT2Block::forward(const Tensor& x) {
  // As Hugging Face's GPT2Model: checkpointed only while training (evaluation keeps nothing for
  // backward anyway); the block's dropouts all draw from dropout_generator_.
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x,
                              {.generators = {dropout_generator_}});
}

Tensor GPT2Block::forward_block(const Tensor& x) {
  // Each branch's dropout and its residual add in one pass (ops::dropout_add): in training with
  // dropout that saves a read and a write of the activations per branch.
  const Tensor h = attn_->forward_add(ln_1_->forward(x), x);
  return mlp_->forward_add(ln_2_->forward(h), h);
}

// ---- the model

namespace {

Tensor embed(Embedding& wte, Embedding& wpe, Dropout& drop, const Tensor& ids) {
  COLOSSAL_CHECK(ids.dim() == 2, "GPT2: expected token ids [B, T], got shape {}", ids.shape());
  const int64_t tokens = ids.size(1);
  COLOSSAL_CHECK(tokens <= wpe.num_embeddings(), "GPT2: sequences of {} tokens exceed n_positions = {}", tokens,
                 wpe.num_embeddings());
  const Tensor positions = core::arange(0.0, static_cast<double>(tokens), 1.0, TensorOptions(DType::i64, ids.device()));
  return drop.forward(ops::add(wte.forward(ids), wpe.forward(positions)));
}

Tensor head(LayerNorm& ln_f, const Embedding& wte, const Tensor& hidden) {
  return ops::linear(ln_f.forward(hidden), wte.weight());
}

}  // namespace

GPT2::GPT2(const GPT2Config& config, core::Generator* generator, core::Generator* dropout_generator,
           const PieceFilter& build)
    : Module("GPT2"), config_(config) {
  config.validate();
  // Note [Pieces built]: a piece left out is a stand-in: blocks one feature per head, embeddings 1 x 1.
  const auto built = [&build](int64_t piece) { return !build || build(static_cast<size_t>(piece)); };
  GPT2Config stand_in = config;
  stand_in.n_embd = config.n_head;
  const bool embed = built(0), head = built(config.n_layer + 1);
  wte_ =
      register_module("wte", std::make_shared<Embedding>(embed || head ? config.padded_vocab_size() : 1,
                                                         embed || head ? config.n_embd : 1, std::nullopt, generator));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(embed ? config.n_positions : 1, embed ? config.n_embd : 1,
                                                            std::nullopt, generator));
  drop_ = register_module("drop", std::make_shared<Dropout>(config.dropout, dropout_generator));
  h_ = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i)
    h_->push_back(std::make_shared<GPT2Block>(built(i + 1) ? config : stand_in, generator, dropout_generator));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon));

  // HF's _init_weights: the matrices N(0, initializer_range), the residual-stream writers scaled
  // down by sqrt(2 n_layer); biases and LayerNorms already hold zeros and ones. Conv1D drew its
  // weight from N(0, 0.02) itself (HF's Conv1D default), so with the usual initializer_range only
  // the embeddings and the c_proj weights need drawing again (a third of a 124M model's draws).
  constexpr double kConv1DStd = 0.02;
  const double residual_std = config.initializer_range / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const auto& [name, param] : named_parameters()) {
    if (param.dim() < 2) continue;
    if (name.ends_with("c_proj.weight")) {
      init::normal_(param, 0.0, residual_std, generator);
    } else if (name == "wte.weight" || name == "wpe.weight" || config.initializer_range != kConv1DStd) {
      init::normal_(param, 0.0, config.initializer_range, generator);
    }
  }
}

void GPT2::set_checkpoint_activations(bool on) {
  config_.checkpoint_activations = on;
  for (size_t i = 0; i < h_->size(); ++i) h_->at<GPT2Block>(i)->set_checkpoint_activations(on);
}

Tensor GPT2::forward(const Tensor& ids) {
  Tensor hidden = embed(*wte_, *wpe_, *drop_, ids);
  for (const auto& block : *h_) hidden = (*block)(hidden);  // through its forward hooks (ZeRO-3)
  return head(*ln_f_, *wte_, hidden);
}

std::vector<std::shared_ptr<Module>> GPT2::layers() {
  std::vector<std::shared_ptr<Module>> pieces;
  auto embed_view = std::make_shared<LayerView>(
      "GPT2Embed",
      [wte = wte_, wpe = wpe_, drop = drop_](LayerView&, const Tensor& ids) { return embed(*wte, *wpe, *drop, ids); });
  embed_view->share_module("wte", wte_);
  embed_view->share_module("wpe", wpe_);
  embed_view->share_module("drop", drop_);
  pieces.push_back(embed_view);
  for (size_t i = 0; i < h_->size(); ++i) {
    auto block = (*h_)[i];
    auto view =
        std::make_shared<LayerView>("GPT2Block", [block](LayerView&, const Tensor& x) { return block->forward(x); });
    view->share_module("h." + std::to_string(i), block);
    pieces.push_back(view);
  }
  auto head_view = std::make_shared<LayerView>(
      "GPT2Head", [ln_f = ln_f_, wte = wte_](LayerView&, const Tensor& hidden) { return head(*ln_f, *wte, hidden); });
  head_view->share_module("ln_f", ln_f_);
  head_view->share_module("wte", wte_);
  pieces.push_back(head_view);
  return pieces;
}

Tensor lm_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  COLOSSAL_CHECK(
      logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
      "lm_cross_entropy: expected logits [B, T, V] and targets [B, T], got {} and {}", logits.shape(), targets.shape());
  const int64_t rows = logits.size(0) * logits.size(1);
  return ops::cross_entropy(logits.reshape({rows, logits.size(2)}), targets.reshape({rows}),
                            {.ignore_index = ignore_index});
}

}  // namespace colossal::nn::models
