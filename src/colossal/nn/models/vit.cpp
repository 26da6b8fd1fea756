// VisionTransformer: configuration presets and parsing, timm's module structure and
// initialisation, class-token pooling and the pipeline pieces.
#include "colossal/nn/models/vit.h"

#include <nlohmann/json.hpp>

#include "colossal/nn/init.h"          // trunc_normal_, normal_, zeros_
#include "colossal/ops/elementwise.h"  // add
#include "colossal/ops/indexing.h"     // cat

namespace colossal::nn::models {

// ---- ViTConfig

int64_t ViTConfig::mlp_hidden() const {
  return static_cast<int64_t>(static_cast<double>(embed_dim) * mlp_ratio);  // timm truncates
}

int64_t ViTConfig::num_parameters() const {
  validate();
  const int64_t c = embed_dim, hidden = mlp_hidden();
  const int64_t patch = c * in_chans * patch_size * patch_size + c;
  const int64_t per_block = 4 * c                                    // norm1, norm2
                            + 3 * c * c + (qkv_bias ? 3 * c : 0)     // qkv
                            + c * c + c                              // proj
                            + hidden * c + hidden + hidden * c + c;  // fc1, fc2
  return patch + c + (1 + num_patches()) * c + depth * per_block + 2 * c + num_classes * c + num_classes;
}

void ViTConfig::validate() const {
  COLOSSAL_CHECK(
      img_size > 0 && patch_size > 0 && in_chans > 0 && num_classes > 0 && embed_dim > 0 && depth > 0 && num_heads > 0,
      "ViTConfig: img_size ({}), patch_size ({}), in_chans ({}), num_classes ({}), embed_dim ({}), depth "
      "({}) and num_heads ({}) must all be positive",
      img_size, patch_size, in_chans, num_classes, embed_dim, depth, num_heads);
  COLOSSAL_CHECK(img_size % patch_size == 0, "ViTConfig: patch_size {} must divide img_size {}", patch_size, img_size);
  COLOSSAL_CHECK(embed_dim % num_heads == 0, "ViTConfig: num_heads {} must divide embed_dim {}", num_heads, embed_dim);
  COLOSSAL_CHECK(mlp_ratio > 0.0, "ViTConfig: mlp_ratio must be positive, got {}", mlp_ratio);
  COLOSSAL_CHECK(norm_eps > 0.0, "ViTConfig: norm_eps must be positive, got {}", norm_eps);
  const std::pair<const char*, double> rates[] = {{"drop_rate", drop_rate},
                                                  {"pos_drop_rate", pos_drop_rate},
                                                  {"proj_drop_rate", proj_drop_rate},
                                                  {"attn_drop_rate", attn_drop_rate},
                                                  {"drop_path_rate", drop_path_rate}};
  for (const auto& [name, rate] : rates) {
    COLOSSAL_CHECK(rate >= 0.0 && rate <= 1.0, "ViTConfig: {} must be in [0, 1], got {}", name, rate);
  }
}

namespace {
ViTConfig preset(int64_t img_size, int64_t patch_size, int64_t in_chans, int64_t num_classes, int64_t embed_dim,
                 int64_t depth, int64_t num_heads) {
  ViTConfig config;
  config.img_size = img_size;
  config.patch_size = patch_size;
  config.in_chans = in_chans;
  config.num_classes = num_classes;
  config.embed_dim = embed_dim;
  config.depth = depth;
  config.num_heads = num_heads;
  return config;
}
}  // namespace

ViTConfig ViTConfig::vit_tiny_patch16_224(int64_t num_classes) {
  return preset(224, 16, 3, num_classes, 192, 12, 3);
}
ViTConfig ViTConfig::vit_small_patch16_224(int64_t num_classes) {
  return preset(224, 16, 3, num_classes, 384, 12, 6);
}
ViTConfig ViTConfig::vit_base_patch16_224(int64_t num_classes) {
  return preset(224, 16, 3, num_classes, 768, 12, 12);
}
ViTConfig ViTConfig::vit_large_patch16_224(int64_t num_classes) {
  return preset(224, 16, 3, num_classes, 1024, 24, 16);
}
ViTConfig ViTConfig::vit_tiny_patch4_32(int64_t num_classes) {
  return preset(32, 4, 3, num_classes, 192, 12, 3);
}
ViTConfig ViTConfig::vit_tiny_patch4_28(int64_t num_classes) {
  return preset(28, 4, 1, num_classes, 192, 12, 3);
}

ViTConfig ViTConfig::from_json(std::string_view json) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1E400
    COLOSSAL_FAIL("ViTConfig::from_json: not valid JSON: {}", e.what());
  }
  COLOSSAL_CHECK(parsed.is_object(), "ViTConfig::from_json: expected a JSON object, got {}", parsed.type_name());
  ViTConfig config;
  auto read = [&]<class T>(const char* key, T& field) {
    if (!parsed.contains(key)) return;
    const nlohmann::json& value = parsed[key];
    if constexpr (std::is_same_v<T, bool>) {
      COLOSSAL_CHECK(value.is_boolean(), "ViTConfig::from_json: '{}' must be true or false, got {}", key, value.dump());
    } else if constexpr (std::is_integral_v<T>) {
      COLOSSAL_CHECK(value.is_number_integer(), "ViTConfig::from_json: '{}' must be an integer, got {}", key,
                     value.dump());
    } else {
      COLOSSAL_CHECK(value.is_number(), "ViTConfig::from_json: '{}' must be a number, got {}", key, value.dump());
    }
    field = value.get<T>();
  };
  read("img_size", config.img_size);
  read("patch_size", config.patch_size);
  read("in_chans", config.in_chans);
  read("num_classes", config.num_classes);
  read("embed_dim", config.embed_dim);
  read("depth", config.depth);
  read("num_heads", config.num_heads);
  read("mlp_ratio", config.mlp_ratio);
  read("qkv_bias", config.qkv_bias);
  read("drop_rate", config.drop_rate);
  read("pos_drop_rate", config.pos_drop_rate);
  read("proj_drop_rate", config.proj_drop_rate);
  read("attn_drop_rate", config.attn_drop_rate);
  read("drop_path_rate", config.drop_path_rate);
  config.validate();
  return config;
}

// ---- the model

namespace {

Tensor embed(PatchEmbedding& patch_embed, const Tensor& cls_token, const Tensor& pos_embed, Dropout& pos_drop,
             const Tensor& images) {
  const Tensor patches = patch_embed.forward(images);  // [B, N, C]
  const int64_t batch = patches.size(0);
  const Tensor cls = cls_token.expand({batch, 1, cls_token.size(2)});
  return pos_drop.forward(ops::add(ops::cat({cls, patches}, 1), pos_embed));
}

Tensor classify(LayerNorm& norm, Dropout& head_drop, Linear& head, const Tensor& tokens) {
  // Class-token pooling (timm's global_pool='token').
  return head.forward(head_drop.forward(norm.forward(tokens).select(1, 0)));
}

}  // namespace

VisionTransformer::VisionTransformer(const ViTConfig& config, core::Generator* generator,
                                     core::Generator* dropout_generator, const PieceFilter& build)
    : Module("VisionTransformer"), config_(config) {
  config.validate();
  // Note [Pieces built]: a piece left out is a stand-in: blocks one feature per head, the embedding one
  // one-pixel patch of width 1, the head one class.
  const auto built = [&build](int64_t piece) { return !build || build(static_cast<size_t>(piece)); };
  const bool embed = built(0), head = built(config.depth + 1);
  const int64_t c = config.embed_dim, e = embed ? c : 1;
  cls_token_ = &register_parameter("cls_token", core::zeros({1, 1, e}));
  pos_embed_ = &register_parameter("pos_embed", core::zeros({1, embed ? 1 + config.num_patches() : 1, e}));
  patch_embed_ = register_module(
      "patch_embed",
      embed ? std::make_shared<PatchEmbedding>(config.img_size, config.patch_size, config.in_chans, c, true, generator)
            : std::make_shared<PatchEmbedding>(1, 1, 1, 1, true, generator));
  pos_drop_ = register_module("pos_drop", std::make_shared<Dropout>(config.pos_drop_rate, dropout_generator));
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.depth; ++i) {
    const double drop_path =
        config.depth > 1 ? config.drop_path_rate * static_cast<double>(i) / static_cast<double>(config.depth - 1) : 0.0;
    const int64_t width = built(i + 1) ? c : config.num_heads;
    blocks_->push_back(std::make_shared<TransformerBlock>(
        width, config.num_heads,
        TransformerBlockOptions{.mlp_ratio = config.mlp_ratio,
                                .qkv_bias = config.qkv_bias,
                                .proj_dropout = config.proj_drop_rate,
                                .attn_dropout = config.attn_drop_rate,
                                .drop_path = drop_path,
                                .norm_eps = config.norm_eps,
                                .dropout_generator = dropout_generator,
                                .checkpoint_activations = config.checkpoint_activations},
        generator));
  }
  norm_ = register_module("norm", std::make_shared<LayerNorm>(head ? c : 1, config.norm_eps));
  head_drop_ = register_module("head_drop", std::make_shared<Dropout>(config.drop_rate, dropout_generator));
  head_ =
      register_module("head", std::make_shared<Linear>(head ? c : 1, head ? config.num_classes : 1, true, generator));

  // timm's init_weights(''): the position embedding, the class token, then every Linear.
  init::trunc_normal_(*pos_embed_, 0.0, 0.02, -2.0, 2.0, generator);
  init::normal_(*cls_token_, 0.0, 1e-6, generator);
  for (const auto& [name, module] : named_modules()) {
    auto* linear = dynamic_cast<Linear*>(module);
    if (linear == nullptr) continue;
    if (config.zero_head_init && linear == head_.get()) {
      init::zeros_(linear->weight());
    } else {
      init::trunc_normal_(linear->weight(), 0.0, 0.02, -2.0, 2.0, generator);
    }
    if (linear->bias().defined()) init::zeros_(linear->bias());
  }
}

Tensor VisionTransformer::forward(const Tensor& images) {
  Tensor tokens = embed(*patch_embed_, *cls_token_, *pos_embed_, *pos_drop_, images);
  for (const auto& block : *blocks_) tokens = (*block)(tokens);  // through its forward hooks (ZeRO-3)
  return classify(*norm_, *head_drop_, *head_, tokens);
}

void VisionTransformer::set_checkpoint_activations(bool on) {
  config_.checkpoint_activations = on;
  for (size_t i = 0; i < blocks_->size(); ++i) blocks_->at<TransformerBlock>(i)->set_checkpoint_activations(on);
}

std::vector<std::shared_ptr<Module>> VisionTransformer::layers() {
  std::vector<std::shared_ptr<Module>> pieces;
  auto embed_view = std::make_shared<LayerView>(
      "ViTEmbed", [patch_embed = patch_embed_, pos_drop = pos_drop_](LayerView& view, const Tensor& images) {
        return embed(*patch_embed, view.parameter("cls_token"), view.parameter("pos_embed"), *pos_drop, images);
      });
  embed_view->share_parameter("cls_token", *cls_token_);
  embed_view->share_parameter("pos_embed", *pos_embed_);
  embed_view->share_module("patch_embed", patch_embed_);
  embed_view->share_module("pos_drop", pos_drop_);
  pieces.push_back(embed_view);
  for (size_t i = 0; i < blocks_->size(); ++i) {
    auto block = (*blocks_)[i];
    auto view =
        std::make_shared<LayerView>("ViTBlock", [block](LayerView&, const Tensor& x) { return block->forward(x); });
    view->share_module("blocks." + std::to_string(i), block);
    pieces.push_back(view);
  }
  auto head_view = std::make_shared<LayerView>(
      "ViTHead", [norm = norm_, head_drop = head_drop_, linear = head_](LayerView&, const Tensor& tokens) {
        return classify(*norm, *head_drop, *linear, tokens);
      });
  head_view->share_module("norm", norm_);
  head_view->share_module("head_drop", head_drop_);
  head_view->share_module("head", head_);
  pieces.push_back(head_view);
  return pieces;
}

}  // namespace colossal::nn::models
