// safetensors: round trips of every dtype with metadata, the reference file layout (length,
// padding, alignment), reading the golden files, the atomic writer, and one test per way a file
// can be broken, each checking that the error names the file and the tensor at fault.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstring>
#include <filesystem>
#include <fstream>

#include "colossal/nn/safetensors.h"
#include "colossal/ops.h"
#include "gradcheck.h"

namespace colossal {
namespace {

namespace fs = std::filesystem;
using nn::load_safetensors;
using nn::save_safetensors;
using testing::expect_close;

/// A fresh directory per test, removed afterwards.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) / fmt::format("colossal_safetensors_{}_{}", ::getpid(),
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  /// A file with this header text (length prefix added) followed by `data`.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    write_bytes(path(name), bytes + header + data);
    return path(name);
  }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeShapeAndTheMetadata) {
  nn::StateDict tensors;
  tensors.insert("u8", core::from_vector<uint8_t>({0, 7, 255}, {3}));
  tensors.insert("f64", testing::random_tensor({2, 3}, 1));
  tensors.insert("f32.transposed", testing::random_tensor({3, 4}, 2, -1, 1, DType::f32).t());  // not contiguous
  tensors.insert("f16", testing::random_tensor({5}, 3, -1, 1, DType::f16));
  tensors.insert("bf16", testing::random_tensor({2, 2, 2}, 4, -1, 1, DType::bf16));
  tensors.insert("i64", core::from_vector<int64_t>({-1, 1LL << 40, 3}, {3}));
  tensors.insert("i32", core::from_vector<int32_t>({-7, 8}, {1, 2}));
  tensors.insert("flags", core::from_vector<bool>({true, false, true}, {3}));
  tensors.insert("scalar", core::scalar_tensor(2.5, DType::f32));
  tensors.insert("empty", core::zeros({0, 3}));
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"step", "12"}};
  save_safetensors(path("all.safetensors"), tensors, metadata);

  const nn::SafetensorsFile file = load_safetensors(path("all.safetensors"));
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    const Tensor& actual = file.tensors.at(name);
    EXPECT_EQ(actual.dtype(), expected.dtype()) << name;
    EXPECT_TRUE(actual.device().is_cpu()) << name;
    if (core::is_floating(expected.dtype())) {
      expect_close(actual, expected, 0, 0, name);  // bit for bit
    } else {
      EXPECT_EQ(actual.shape(), expected.shape()) << name;
      EXPECT_EQ(actual.to_vector<int64_t>(), expected.to_vector<int64_t>()) << name;
    }
  }
  // Written widest element first (each tensor aligned to its element size), then in dict order.
  EXPECT_EQ(file.tensors.keys(), (std::vector<std::string>{"f64", "i64", "f32.transposed", "i32", "scalar", "empty",
                                                           "f16", "bf16", "u8", "flags"}));
}

TEST_F(Safetensors, LayoutIsTheReferenceOne) {
  nn::StateDict tensors;
  tensors.insert("b", core::ones({3}, DType::f16));
  tensors.insert("a", core::ones({2}, DType::f64));
  save_safetensors(path("x.safetensors"), tensors, {{"k", "v"}});
  const std::string bytes = read_bytes(path("x.safetensors"));
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);  // little-endian u64, as the host
  EXPECT_EQ((8 + length) % 8, 0u) << "the header is padded so that the data starts aligned";
  const std::string header = bytes.substr(8, length);
  EXPECT_EQ(header.substr(0, 26), R"({"__metadata__":{"k":"v"},)");
  EXPECT_NE(header.find(R"("a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]})"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("b":{"dtype":"F16","shape":[3],"data_offsets":[16,22]})"), std::string::npos) << header;
  EXPECT_EQ(bytes.size(), 8 + length + 22);

  const nn::SafetensorsHeader parsed = nn::read_safetensors_header(path("x.safetensors"));
  EXPECT_EQ(parsed.data_start, 8 + length);
  ASSERT_EQ(parsed.entries.size(), 2u);
  EXPECT_EQ(parsed.entries[1].name, "b");
  EXPECT_EQ(parsed.entries[1].dtype, DType::f16);
  EXPECT_EQ(parsed.entries[1].begin, 16u);
}

TEST_F(Safetensors, ReadsTheGoldenFilesWrittenByPython) {
  const nn::SafetensorsFile gpt2 =
      load_safetensors(std::string(COLOSSAL_TEST_DATA_DIR) + "/golden/gpt2_tiny.safetensors");
  EXPECT_EQ(gpt2.metadata.at("model"), "gpt2");
  EXPECT_NE(gpt2.metadata.at("config").find("\"n_embd\": 64"), std::string::npos);
  const Tensor& ids = gpt2.tensors.at("input.ids");
  EXPECT_EQ(ids.dtype(), DType::i64);
  EXPECT_EQ(ids.shape(), (Shape{4, 32}));
  for (int64_t id : ids.to_vector<int64_t>()) EXPECT_TRUE(id >= 0 && id < 1000);
  EXPECT_EQ(gpt2.tensors.at("param.wte.weight").shape(), (Shape{1000, 64}));
  EXPECT_EQ(gpt2.tensors.at("param.h.0.ln_1.weight").dtype(), DType::f64);
}

TEST_F(Safetensors, WriterReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  nn::StateDict first, second;
  first.insert("w", core::full({4}, 1.0));
  second.insert("w", core::full({4}, 2.0));
  save_safetensors(path("ckpt.safetensors"), first);
  save_safetensors(path("ckpt.safetensors"), second);
  testing::expect_values(load_safetensors(path("ckpt.safetensors")).tensors.at("w"), {2, 2, 2, 2});

  // A write that fails part-way leaves the previous file as it was, and nothing beside it.
  nn::StateDict broken;
  broken.insert("w", core::full({4}, 3.0));
  broken.insert("undefined", Tensor());
  EXPECT_ERROR_CONTAINS(save_safetensors(path("ckpt.safetensors"), broken), "tensor 'undefined' is undefined");
  testing::expect_values(load_safetensors(path("ckpt.safetensors")).tensors.at("w"), {2, 2, 2, 2});
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u);

  EXPECT_ERROR_CONTAINS(save_safetensors(path("missing_dir/x.safetensors"), first), "cannot create");
  nn::StateDict reserved;
  reserved.insert("__metadata__", core::ones({1}));
  EXPECT_ERROR_CONTAINS(save_safetensors(path("r.safetensors"), reserved), "'__metadata__' cannot name a tensor");
}

TEST_F(Safetensors, MissingTooShortAndOverlongFiles) {
  EXPECT_ERROR_CONTAINS(load_safetensors(path("nothing.safetensors")), "nothing.safetensors': cannot read it");
  write_bytes(path("short.safetensors"), "abc");
  EXPECT_ERROR_CONTAINS(load_safetensors(path("short.safetensors")),
                        "short.safetensors': the file is 3 bytes, shorter than the 8-byte header length");
  // A length that points past the end of the file: truncated, or not safetensors at all.
  write_bytes(path("text.safetensors"), "this is not a safetensors file");
  EXPECT_ERROR_CONTAINS(load_safetensors(path("text.safetensors")), "only 22 bytes follow it");
  const std::string huge = write_raw("huge.safetensors", "{}", "");
  std::string bytes = read_bytes(huge);
  bytes[0] = 0x10;  // length 16 > 2 bytes that follow
  write_bytes(huge, bytes);
  EXPECT_ERROR_CONTAINS(load_safetensors(huge), "the header length says 16 bytes, but only 2 bytes follow it");
}

TEST_F(Safetensors, BadHeaders) {
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("json.safetensors", "{\"a\": ", "")),
                        "the header is not valid JSON");
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("array.safetensors", "[1, 2]", "")),
                        "the header must be a JSON object, got array");
  EXPECT_ERROR_CONTAINS(
      load_safetensors(
          write_raw("fp8.safetensors", R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "ab")),
      "tensor 'w': dtype 'F8_E4M3' is not one colossal holds");
  EXPECT_ERROR_CONTAINS(
      load_safetensors(write_raw("size.safetensors", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                                 std::string(8, '\0'))),
      "tensor 'w': data_offsets [0, 8] span 8 bytes, but F32 [3] needs 12 bytes");
  EXPECT_ERROR_CONTAINS(
      load_safetensors(write_raw("neg.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                                 std::string(4, '\0'))),
      "tensor 'w': shape [-1] must hold non-negative integers");
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("noshape.safetensors", R"({"w": {"dtype": "F32"}})", "")),
                        "tensor 'w': the header entry has no array 'shape'");
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("meta.safetensors", R"({"__metadata__": {"step": 3}})", "")),
                        "__metadata__ 'step' must be a string, got number");
}

TEST_F(Safetensors, OffsetsThatDisagreeWithTheData) {
  const std::string two = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "b": {"dtype": "F32", "shape": [1], "data_offsets": [BEGIN, END]}})";
  auto header = [&](int begin, int end) {
    std::string h = two;
    h.replace(h.find("BEGIN"), 5, std::to_string(begin));
    h.replace(h.find("END"), 3, std::to_string(end));
    return h;
  };
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("gap.safetensors", header(8, 12), std::string(12, '\0'))),
                        "tensor 'b' starts at data byte 8, but the tensors before it end at byte 4: the header's "
                        "data_offsets leave a gap");
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("overlap.safetensors", header(2, 6), std::string(6, '\0'))),
                        "data_offsets overlap");
  // Data cut short: the last tensor's bytes are not all there.
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("cut.safetensors", header(4, 8), std::string(6, '\0'))),
                        "tensor 'b' needs data bytes [4, 8), but the file holds only 6 bytes of data: the file is "
                        "truncated");
  EXPECT_ERROR_CONTAINS(load_safetensors(write_raw("extra.safetensors", header(4, 8), std::string(10, '\0'))),
                        "2 bytes follow the last tensor's data");

  // A real file cut anywhere in its data names the file and a tensor.
  nn::StateDict tensors;
  tensors.insert("weight", testing::random_tensor({16, 16}, 5, -1, 1, DType::f32));
  save_safetensors(path("good.safetensors"), tensors);
  const std::string bytes = read_bytes(path("good.safetensors"));
  write_bytes(path("truncated.safetensors"), bytes.substr(0, bytes.size() - 100));
  EXPECT_ERROR_CONTAINS(load_safetensors(path("truncated.safetensors")),
                        "truncated.safetensors': tensor 'weight' needs data bytes [0, 1024), but the file holds only "
                        "924 bytes of data");
}

TEST_F(Safetensors, BoolBytesMustBeZeroOrOne) {
  const std::string file =
      write_raw("bool.safetensors", R"({"mask": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})",
                std::string("\x01\x00\x02", 3));
  EXPECT_ERROR_CONTAINS(load_safetensors(file), "tensor 'mask': BOOL element 2 holds byte 2, which is neither 0 nor 1");
}

TEST_F(Safetensors, StateDictsOfModulesRoundTrip) {
  // Parameters that require grad, and a view of one, save as plain data.
  Tensor param = testing::random_tensor({4, 3}, 9);
  param.set_requires_grad(true);
  nn::StateDict tensors;
  tensors.insert("param", param);
  tensors.insert("row", param.detach().select(0, 2));
  save_safetensors(path("p.safetensors"), tensors);
  const nn::SafetensorsFile file = load_safetensors(path("p.safetensors"));
  expect_close(file.tensors.at("param"), param.detach(), 0, 0);
  expect_close(file.tensors.at("row"), param.detach().select(0, 2), 0, 0);
  EXPECT_FALSE(file.tensors.at("param").requires_grad());
}

}  // namespace
}  // namespace colossal
