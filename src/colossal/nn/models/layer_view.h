// LayerView: one piece of a model, for cutting the model into pipeline stages. Every model in
// this folder offers layers(): its forward as an ordered list of LayerViews, where piece i maps
// piece i - 1's output to its own, so that composing them is the model's forward.
//
// Note [Pipeline layers]: a LayerView holds the modules (and root-level parameters) its piece
// uses under the same dotted names as in the whole model ("h.3.attn.c_attn.weight",
// "cls_token"), so a stage made of consecutive pieces has named_parameters() and state_dict()
// that are exactly a subset of the model's: optimizers, checkpoints and the pipeline's per-stage
// gradient handling need no renaming. The pieces share the model's modules rather than copying
// them; a tied weight (GPT-2's wte, used by the first piece and the last) appears in both pieces,
// and a pipeline must sum its gradient between the two stages that hold it (Megatron's embedding
// group). Take the views after any to(dtype) or to(device) of the model and convert the stages,
// not the model, from then on (Note [Parameter slots]): a root-level parameter registered in a
// view has its own slot. Registering a module in a view makes the view its latest parent (see
// Module::parent_); the module keeps its parameter names either way.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "colossal/nn/module.h"

namespace colossal::nn::models {

/// Note [Pieces built]
/// Which pieces of a model's layers() to build at full size (piece indices as layers() orders them;
/// empty: all). A piece left out is built as a stand-in: the same modules, parameter names and
/// dimensions' count, every width 1 (or the least its module takes). It draws from the initial
/// weights' generator exactly as the full piece would, since every initialiser reserves one Philox
/// offset per call whatever the tensor's size (core/random.h), so the pieces built get the serial
/// model's weights bit for bit. A pipeline stage builds its own pieces only (initialize/
/// pipeline_stage.h), instead of the whole model on every rank first.
using PieceFilter = std::function<bool(size_t piece)>;

class LayerView : public Module {
 public:
  /// fn computes the piece; it gets the view (to read the parameters registered in it) and the
  /// previous piece's output.
  using Fn = std::function<Tensor(LayerView&, const Tensor&)>;
  LayerView(std::string type_name, Fn fn) : Module(std::move(type_name)), fn_(std::move(fn)) {}

  /// Registers a module of the model under its dotted path there ("h.3", "ln_f"), adding plain
  /// container modules for the leading components.
  void share_module(std::string_view dotted_name, std::shared_ptr<Module> module);
  /// Registers a root-level parameter of the model ("cls_token") under its name there.
  void share_parameter(std::string name, const Tensor& parameter);

  Tensor forward(const Tensor& x) override { return fn_(*this, x); }

 private:
  Fn fn_;
};

}  // namespace colossal::nn::models
