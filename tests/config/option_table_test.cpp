// OptionTable, the free-form model.options and data.options: typed getters with their fallbacks,
// errors naming the full key and where it was set, and the unknown-option check consumers run.
#include <gtest/gtest.h>

#include "colossal/config/train_config.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::config {
namespace {

TEST(OptionTable, TypedGettersAndFallbacks) {
  const TrainConfig c = parse_config(
      "[model.options]\nn_layer = 2\ndropout = 0.1\nwidth = 64\ncheckpoint = true\nact = \"gelu\"\n", {}, "m.toml");
  const OptionTable& options = c.model.options;
  EXPECT_EQ(options.prefix(), "model.options");
  EXPECT_EQ(options.get_int("n_layer", 12), 2);
  EXPECT_EQ(options.get_int("n_head", 12), 12);  // absent: the fallback
  EXPECT_EQ(options.get_double("dropout", 0), 0.1);
  EXPECT_EQ(options.get_double("width", 0), 64.0);  // integers are numbers too
  EXPECT_TRUE(options.get_bool("checkpoint", false));
  EXPECT_EQ(options.get_string("act", "relu"), "gelu");
  EXPECT_EQ(options.get_string("norm", "layer"), "layer");
  EXPECT_NO_THROW(options.reject_unknown({"n_layer", "dropout", "width", "checkpoint", "act", "unused_but_known"}));
}

TEST(OptionTable, ErrorsNameTheFullKeyAndItsOrigin) {
  const TrainConfig c = parse_config("[model.options]\nn_layer = 2.5\nact = 3\n",
                                     {"model.options.dropout=2", "model.options.flag=1"}, "m.toml");
  const OptionTable& options = c.model.options;
  EXPECT_ERROR_CONTAINS(options.get_int("n_layer", 0),
                        "m.toml:2: model.options.n_layer = 2.5: expected an integer, got a float");
  EXPECT_ERROR_CONTAINS(options.get_string("act", ""), "m.toml:3: model.options.act = 3: expected a string");
  EXPECT_ERROR_CONTAINS(options.get_double("dropout", 0, 0, 1),
                        "--set model.options.dropout=2: model.options.dropout = 2 is out of range: must be between 0 "
                        "and 1");
  EXPECT_ERROR_CONTAINS(options.get_bool("flag", false), "expected a boolean (true or false), got an integer");
  EXPECT_ERROR_CONTAINS(options.get_int("n_layer", 0, 1, 4), "model.options.n_layer");
}

TEST(OptionTable, RejectUnknownSuggests) {
  OptionTable options("model.options");
  options.set("n_layr", OptionValue{int64_t{2}}, "m.toml:7");
  EXPECT_ERROR_CONTAINS(options.reject_unknown({"n_layer", "n_head"}),
                        "m.toml:7: model.options.n_layr: unknown option; did you mean \"n_layer\"?");
  options.set("zzz", OptionValue{true});
  EXPECT_ERROR_CONTAINS(options.reject_unknown({"n_layer", "n_head"}), "2 unknown options in model.options");
  EXPECT_ERROR_CONTAINS(options.reject_unknown({"n_layer", "n_head"}),
                        "model.options.zzz: unknown option; the options are \"n_layer\", \"n_head\"");
}

TEST(OptionTable, ValuesSpellAsToml) {
  EXPECT_EQ(to_toml(OptionValue{true}), "true");
  EXPECT_EQ(to_toml(OptionValue{int64_t{-3}}), "-3");
  EXPECT_EQ(to_toml(OptionValue{2.0}), "2.0");
  EXPECT_EQ(to_toml(OptionValue{1e-3}), "0.001");
  EXPECT_EQ(to_toml(OptionValue{std::string("a\"b\n")}), "\"a\\\"b\\n\"");
  EXPECT_EQ(to_toml(OptionValue{OptionValue::Array{{int64_t{1}}, {std::string("x")}}}), "[1, \"x\"]");
  EXPECT_EQ(toml_float(1e20), "1e+20");
  EXPECT_EQ(toml_float(-std::numeric_limits<double>::infinity()), "-inf");
}

}  // namespace
}  // namespace colossal::config
