// safetensors reader/writer tests. Round trips cover every dtype and conversion; each malformed
// input is crafted byte by byte and must raise ingot::Error naming the file (and tensor/dtype).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "ingot/core/dtype.h"
#include "ingot/core/error.h"
#include "ingot/io/json_util.h"
#include "ingot/io/safetensors.h"
#include "test_util.h"

namespace ingot::io {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::HostTensor;

// Writes 8-byte little-endian header length, the header text and `data` bytes, unvalidated.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

void expect_open_error(const std::string& path, std::initializer_list<std::string> parts) {
  expect_error([&] { SafeTensorsReader::open(path); }, parts);
}

TEST(SafeTensors, RoundTripEveryDtype) {
  const std::string dir = test::temp_dir("safetensors_round_trip");
  const std::string path = dir + "/all.safetensors";
  HostTensor<float> f32(DType::f32, {3, 5});
  test::fill_normal(f32.storage, 1);
  f32.storage[0] = 1.0f + 1.0f / 256;  // a bf16 tie: rounds to even
  HostTensor<double> f64(DType::f64, {2, 3});
  test::fill_normal(f64.storage, 2);
  HostTensor<uint16_t> bf16(DType::bf16, {4});
  for (int i = 0; i < 4; ++i) bf16.storage[i] = f32_to_bf16(0.5f * i - 1.0f);
  HostTensor<int32_t> i32(DType::i32, {4});
  HostTensor<int64_t> i64(DType::i64, {2, 2});
  for (int i = 0; i < 4; ++i) i32.storage[i] = -7 + 1000 * i, i64.storage[i] = (int64_t{1} << 40) * (i - 2);
  HostTensor<uint8_t> u8(DType::u8, {3});
  u8.storage = {0, 7, 255};
  HostTensor<float> empty(DType::f32, {0, 4});
  HostTensor<float> scalar(DType::f32, {});
  scalar.storage = {3.25f};

  write_safetensors(path,
                    {{"w.f32", f32.tensor, DType::f32},
                     {"w.as_bf16", f32.tensor, DType::bf16},
                     {"w.as_f16", f32.tensor, DType::f16},
                     {"w.as_f64", f32.tensor, DType::f64},
                     {"d.f64", f64.tensor, DType::f64},
                     {"d.as_bf16", f64.tensor, DType::bf16},
                     {"b.bf16", bf16.tensor, DType::bf16},
                     {"i.i32", i32.tensor, DType::i32},
                     {"i.as_i64", i32.tensor, DType::i64},
                     {"l.i64", i64.tensor, DType::i64},
                     {"u.u8", u8.tensor, DType::u8},
                     {"e.empty", empty.tensor, DType::bf16},
                     {"s.scalar", scalar.tensor, DType::f32}},
                    {{"step", "12"}});

  // Layout: header length keeps the data 8-byte aligned, tensors in sorted name order.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  std::string header_text(header_len, '\0');
  in.read(header_text.data(), static_cast<std::streamsize>(header_len));
  const auto header = nlohmann::json::parse(header_text);
  uint64_t previous_end = 0;
  for (const auto& [name, entry] : header.items()) {  // nlohmann iterates keys in sorted order
    if (name == "__metadata__") continue;
    EXPECT_EQ(entry["data_offsets"][0].get<uint64_t>(), previous_end) << name;
    previous_end = entry["data_offsets"][1].get<uint64_t>();
  }
  EXPECT_EQ(header["w.as_bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["__metadata__"]["format"], "pt");

  auto reader = SafeTensorsReader::open(path);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_EQ(reader.metadata().at("step"), "12");
  EXPECT_EQ(reader.names().size(), 13u);
  EXPECT_EQ(reader.names().front(), "b.bf16");
  EXPECT_EQ(reader.get("w.as_f16").dtype, DType::f16);
  EXPECT_EQ(reader.get("w.as_f16").bytes, 15 * 2);
  EXPECT_EQ(reader.get("w.as_f16").numel(), 15);

  const int64_t n = f32.size();
  HostTensor<float> out(DType::f32, {3, 5});
  reader.read_into("w.f32", out.tensor);
  EXPECT_EQ(out.storage, f32.storage);
  reader.read_into("w.as_f64", out.tensor);
  EXPECT_EQ(out.storage, f32.storage);
  reader.read_into("w.as_bf16", out.tensor);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out.storage[i], bf16_to_f32(f32_to_bf16(f32.storage[i])));
  EXPECT_EQ(out.storage[0], 1.0f);
  reader.read_into("w.as_f16", out.tensor);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out.storage[i], f16_to_f32(f32_to_f16(f32.storage[i])));
  EXPECT_LT(test::relative_error(out.data(), f32.data(), n), 1e-3);

  HostTensor<uint16_t> out_bf16(DType::bf16, {3, 5});
  reader.read_into("w.f32", out_bf16.tensor);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out_bf16.storage[i], f32_to_bf16(f32.storage[i]));
  reader.read_into("w.as_f16", out_bf16.tensor);  // f16 -> bf16 through f32
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out_bf16.storage[i], f32_to_bf16(f16_to_f32(f32_to_f16(f32.storage[i]))));
  HostTensor<double> out_f64(DType::f64, {3, 5});
  reader.read_into("w.as_bf16", out_f64.tensor);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out_f64.storage[i], bf16_to_f32(f32_to_bf16(f32.storage[i])));

  HostTensor<double> d(DType::f64, {2, 3});
  reader.read_into("d.f64", d.tensor);
  EXPECT_EQ(d.storage, f64.storage);
  HostTensor<float> d32(DType::f32, {2, 3});
  reader.read_into("d.f64", d32.tensor);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d32.storage[i], static_cast<float>(f64.storage[i]));

  HostTensor<float> b(DType::f32, {4});
  reader.read_into("b.bf16", b.tensor);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.storage[i], 0.5f * i - 1.0f);

  HostTensor<int32_t> ri32(DType::i32, {4});
  reader.read_into("i.as_i64", ri32.tensor);
  EXPECT_EQ(ri32.storage, i32.storage);
  HostTensor<int64_t> ri64(DType::i64, {4});
  reader.read_into("i.i32", ri64.tensor);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ri64.storage[i], i32.storage[i]);
  HostTensor<int64_t> rl(DType::i64, {2, 2});
  reader.read_into("l.i64", rl.tensor);
  EXPECT_EQ(rl.storage, i64.storage);
  HostTensor<uint8_t> ru8(DType::u8, {3});
  reader.read_into("u.u8", ru8.tensor);
  EXPECT_EQ(ru8.storage, u8.storage);
  HostTensor<float> re(DType::f32, {0, 4});
  reader.read_into("e.empty", re.tensor);
  HostTensor<double> rs(DType::f64, {});
  reader.read_into("s.scalar", rs.tensor);
  EXPECT_EQ(rs.storage[0], 3.25);
}

// f16 conversions against values numpy's float16 gives: ties to even (1 + 2^-11 down to 1, 1 + 3 *
// 2^-11 up to 1 + 2^-9), subnormals at 2^-24 a unit both ways, 65520 (the halfway point past
// 65504) to inf and the float just below it to 65504. The checks above only met values f16 holds.
TEST(SafeTensors, F16ConversionsRoundToNearestEvenAndKeepSubnormals) {
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_f16(-(1.0f + 3 * std::ldexp(1.0f, -11))), 0xBC02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);                 // a tie: to even, zero
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);             // a tie: to even, two units
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
}

// A finite weight beyond f16's range is refused by name before anything is written (it became inf,
// and the export was then refused by its readers); 65504 and values that round to it pass.
TEST(SafeTensors, F16RangeIsChecked) {
  const std::string path = test::temp_dir("safetensors_f16_range") + "/m.safetensors";
  HostTensor<float> ok(DType::f32, {3});
  ok.storage = {65504.0f, -65519.0f, std::numeric_limits<float>::infinity()};
  write_safetensors(path, {{"ok", ok.tensor, DType::f16}});
  HostTensor<float> big(DType::f32, {2});
  big.storage = {1.0f, 1e5f};
  fs::remove(path);
  test::expect_error([&] { write_safetensors(path, {{"model.norm.weight", big.tensor, DType::f16}}); },
                     {"tensor \"model.norm.weight\"", "element 1 = 100000", "beyond f16's range", "bf16 or f32"});
  EXPECT_FALSE(fs::exists(path));
  write_safetensors(path, {{"model.norm.weight", big.tensor, DType::bf16}});
  // At the guard's edge: the float just below 65520 is written (as 65504); 65520 itself would be
  // inf and is refused.
  HostTensor<float> edge(DType::f32, {2});
  edge.storage = {std::nextafter(65520.0f, 0.0f), 65520.0f};
  fs::remove(path);
  test::expect_error([&] { write_safetensors(path, {{"w", edge.tensor, DType::f16}}); },
                     {"element 1 = 65520", "beyond f16's range"});
  HostTensor<float> below(DType::f32, {1});
  below.storage = {std::nextafter(65520.0f, 0.0f)};
  write_safetensors(path, {{"w", below.tensor, DType::f16}});
  const auto reader = SafeTensorsReader::open(path);
  EXPECT_EQ(reader.get("w").dtype, DType::f16);
  uint16_t stored;
  std::memcpy(&stored, reader.get("w").data, 2);
  EXPECT_EQ(stored, 0x7BFF);
}

// So is one beyond bf16's (export --dtype bf16 wrote a 3.4e38 weight as inf with exit 0). The f32
// just below the halfway point to 2^128 rounds to bf16's largest, the halfway point itself to inf;
// from f64, the same bound holds (rounded once).
TEST(SafeTensors, Bf16RangeIsChecked) {
  const std::string path = test::temp_dir("safetensors_bf16_range") + "/m.safetensors";
  const float halfway = std::ldexp(2.0f - std::ldexp(1.0f, -8), 127);  // bits 0x7F7F8000
  HostTensor<float> ok(DType::f32, {2});
  ok.storage = {std::nextafter(halfway, 0.0f), -std::nextafter(halfway, 0.0f)};
  write_safetensors(path, {{"ok", ok.tensor, DType::bf16}});
  HostTensor<float> back(DType::f32, {2});
  SafeTensorsReader::open(path).read_into("ok", back.tensor);
  EXPECT_EQ(back.storage[0], std::ldexp(2.0f - std::ldexp(1.0f, -7), 127));  // bf16's largest, finite
  EXPECT_EQ(back.storage[1], -back.storage[0]);
  fs::remove(path);
  HostTensor<float> big(DType::f32, {3});
  big.storage = {1.0f, 2.0f, -halfway};
  test::expect_error([&] { write_safetensors(path, {{"model.norm.weight", big.tensor, DType::bf16}}); },
                     {"tensor \"model.norm.weight\"", "element 2 = -3.39", "beyond bf16's range", "write f32 instead"});
  EXPECT_FALSE(fs::exists(path));
  HostTensor<double> wide(DType::f64, {2});
  wide.storage = {std::nextafter(double(halfway), 0.0), double(halfway)};
  test::expect_error([&] { write_safetensors(path, {{"w", wide.tensor, DType::bf16}}); },
                     {"tensor \"w\"", "element 1 = ", "beyond bf16's range"});
  wide.storage[1] = 0;
  write_safetensors(path, {{"w", wide.tensor, DType::bf16}});
  SafeTensorsReader::open(path).read_into("w", back.tensor);
  EXPECT_EQ(back.storage[0], std::ldexp(2.0f - std::ldexp(1.0f, -7), 127));
}

TEST(SafeTensors, F64ToBf16RoundsOnce) {
  // 1 + 2^-8 + 2^-40 lies just above a bf16 tie: correct rounding goes up to 1 + 2^-7, while
  // rounding through float first lands exactly on the tie and rounds down to 1.
  const std::string path = test::temp_dir("safetensors_f64_bf16") + "/x.safetensors";
  HostTensor<double> x(DType::f64, {2});
  x.storage = {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), -(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))};
  write_safetensors(path, {{"x", x.tensor, DType::bf16}});
  HostTensor<float> out(DType::f32, {2});
  SafeTensorsReader::open(path).read_into("x", out.tensor);
  EXPECT_EQ(out.storage[0], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(out.storage[1], -(1.0f + std::ldexp(1.0f, -7)));
}

TEST(SafeTensors, ShardedWriteAndRead) {
  const std::string dir = test::temp_dir("safetensors_sharded");
  std::vector<HostTensor<float>> tensors;
  std::vector<TensorToWrite> to_write;
  for (int i = 0; i < 5; ++i) tensors.emplace_back(DType::f32, std::initializer_list<int64_t>{4, 4});
  for (int i = 0; i < 5; ++i) {
    test::fill_normal(tensors[i].storage, 10 + i);
    to_write.push_back({"layer." + std::to_string(i) + ".weight", tensors[i].tensor, DType::bf16});
  }
  // Each tensor is 32 bytes in bf16; 70-byte shards hold two: 2 + 2 + 1.
  write_safetensors_sharded(dir, to_write, 70);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"})
    EXPECT_TRUE(fs::exists(dir + "/" + shard)) << shard;
  std::ifstream index_file(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(index_file);
  EXPECT_EQ(index["metadata"]["total_size"], 5 * 32);
  EXPECT_EQ(index["weight_map"]["layer.0.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.2.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.4.weight"], "model-00003-of-00003.safetensors");

  for (const std::string& path : {dir, dir + "/model.safetensors.index.json"}) {
    auto reader = SafeTensorsReader::open(path);
    ASSERT_EQ(reader.names().size(), 5u);
    EXPECT_NE(reader.get("layer.3.weight").file.find("model-00002-of-00003"), std::string::npos);
    for (int i = 0; i < 5; ++i) {
      HostTensor<float> out(DType::f32, {4, 4});
      reader.read_into(to_write[i].name, out.tensor);
      for (int j = 0; j < 16; ++j) EXPECT_EQ(out.storage[j], bf16_to_f32(f32_to_bf16(tensors[i].storage[j])));
    }
  }

  // Rewriting below the limit leaves one model.safetensors and no stale index or shards.
  write_safetensors_sharded(dir, to_write, 1 << 20);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00003.safetensors"));
  EXPECT_EQ(SafeTensorsReader::open(dir).names().size(), 5u);
  // And back to shards: the stale single file goes.
  write_safetensors_sharded(dir, to_write, 100);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  EXPECT_EQ(SafeTensorsReader::open(dir).names().size(), 5u);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

// ---- malformed files --------------------------------------------------------------------------

class SafeTensorsBadInput : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::temp_dir("safetensors_bad"); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // One F32 tensor "w" of shape (2) over 8 bytes, and a header entry override.
  std::string good_entry() const { return R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"; }
  std::string dir_;
};

TEST_F(SafeTensorsBadInput, MissingFileOrDirectory) {
  expect_open_error(path("nope.safetensors"), {"nope.safetensors", "does not exist"});
  fs::create_directories(path("empty_model"));
  expect_open_error(path("empty_model"), {"empty_model", "model.safetensors"});
}

// As root (CI), the check runs in a child that has become nobody, where the permissions bind.
TEST_F(SafeTensorsBadInput, Unreadable) {
  const std::string p = path("locked.safetensors");
  write_raw(p, R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  fs::permissions(p, fs::perms::none);
  std::string why;
  const std::string message = test::error_with_permissions_binding([&] { SafeTensorsReader::open(p); },
                                                                     fs::path(p).parent_path().string(), &why);
  if (!why.empty()) GTEST_SKIP() << why;
  for (const char* part : {"locked.safetensors", "cannot open"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
}

TEST_F(SafeTensorsBadInput, ShorterThanLengthField) {
  write_bytes(path("short.safetensors"), std::string("\x05\x00\x00", 3));
  expect_open_error(path("short.safetensors"), {"short.safetensors", "truncated"});
}

TEST_F(SafeTensorsBadInput, ShorterThanHeader) {
  std::string bytes(8, '\0');
  bytes[0] = 100;  // header claims 100 bytes; only 10 follow
  write_bytes(path("cut.safetensors"), bytes + R"({"w":{"dty)");
  expect_open_error(path("cut.safetensors"), {"cut.safetensors", "truncated", "100"});
}

TEST_F(SafeTensorsBadInput, HeaderNotJson) {
  write_raw(path("garbage.safetensors"), "{not json at all", "");
  expect_open_error(path("garbage.safetensors"), {"garbage.safetensors", "not valid JSON"});
  write_raw(path("array.safetensors"), "[1,2]", "");
  expect_open_error(path("array.safetensors"), {"array.safetensors", "object"});
}

// JSON nested 100k deep (a header, a config.json value, a tokenizer.json) overflowed the stack when an
// error message printed it: such text is refused before parsing, and a deep value prints briefly.
TEST_F(SafeTensorsBadInput, DeeplyNestedJson) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_raw(path("deep.safetensors"), R"({"a":)" + deep + "}", "");
  expect_open_error(path("deep.safetensors"), {"deep.safetensors", "deeper than 512 levels"});
  // Brackets inside strings do not count.
  EXPECT_NO_THROW(io::check_json_nesting("[\"" + std::string(1000, '[') + "\\\"\"]", "s", "test"));
  const std::string msg = test::error_of([&] { io::parse_json(deep, "config.json", "model config"); });
  EXPECT_NE(msg.find("model config config.json nests arrays or objects deeper than 512 levels"), std::string::npos) << msg;

  nlohmann::json value = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) value = nlohmann::json::array({std::move(value)});
  EXPECT_EQ(io::json_brief(value), "[[[[[[[[[...]]]]]]]]]");
  EXPECT_EQ(io::json_brief(nlohmann::json{{"a", 1}, {"b", "x"}}), R"({"a":1,"b":"x"})");
}

TEST_F(SafeTensorsBadInput, UnknownDtype) {
  write_raw(path("fp8.safetensors"), R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  expect_open_error(path("fp8.safetensors"), {"fp8.safetensors", "\"w\"", "F8_E4M3"});
}

TEST_F(SafeTensorsBadInput, BadDataOffsets) {
  const std::string data(8, '\0');
  write_raw(path("one.safetensors"), R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data);
  expect_open_error(path("one.safetensors"), {"one.safetensors", "\"w\"", "data_offsets"});
  write_raw(path("str.safetensors"), R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", data);
  expect_open_error(path("str.safetensors"), {"str.safetensors", "\"w\"", "data_offsets"});
  write_raw(path("neg.safetensors"), R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", data);
  expect_open_error(path("neg.safetensors"), {"neg.safetensors", "\"w\"", "data_offsets"});
  write_raw(path("desc.safetensors"), R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data);
  expect_open_error(path("desc.safetensors"), {"desc.safetensors", "\"w\"", "ascending"});
  write_raw(path("noshape.safetensors"), R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data);
  expect_open_error(path("noshape.safetensors"), {"noshape.safetensors", "\"w\"", "shape"});
}

TEST_F(SafeTensorsBadInput, OffsetsBeyondData) {
  write_raw(path("trunc.safetensors"), R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
            std::string(12, '\0'));
  expect_open_error(path("trunc.safetensors"), {"trunc.safetensors", "\"w\"", "truncated"});
}

TEST_F(SafeTensorsBadInput, Overlap) {
  write_raw(path("overlap.safetensors"),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  expect_open_error(path("overlap.safetensors"), {"overlap.safetensors", "\"a\"", "\"b\"", "overlaps"});
}

TEST_F(SafeTensorsBadInput, HoleAndTrailingBytes) {
  write_raw(path("hole.safetensors"),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
            std::string(20, '\0'));
  expect_open_error(path("hole.safetensors"), {"hole.safetensors", "\"b\"", "8..12"});
  write_raw(path("tail.safetensors"), R"({"a":)" + good_entry() + "}", std::string(12, '\0'));
  expect_open_error(path("tail.safetensors"), {"tail.safetensors", "trailing"});
}

TEST_F(SafeTensorsBadInput, SizeMismatch) {
  write_raw(path("size.safetensors"), R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  expect_open_error(path("size.safetensors"), {"size.safetensors", "\"w\"", "BF16", "(3)"});
}

TEST_F(SafeTensorsBadInput, NegativeDim) {
  write_raw(path("negdim.safetensors"), R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  expect_open_error(path("negdim.safetensors"), {"negdim.safetensors", "\"w\"", "negative"});
}

TEST_F(SafeTensorsBadInput, DuplicateInOneFile) {
  write_raw(path("twice.safetensors"), R"({"w":)" + good_entry() + R"(,"w":)" + good_entry() + "}", std::string(8, '\0'));
  expect_open_error(path("twice.safetensors"), {"twice.safetensors", "\"w\"", "twice"});
}

// A nested duplicate is not a tensor named twice; a duplicate deep in a header of 100k tensors is
// found without the quadratic parse the callback parser took (300k tensors ran past a minute).
TEST_F(SafeTensorsBadInput, DuplicateAmongManyTensors) {
  std::string header = R"({"w":)" + good_entry();
  for (int i = 0; i < 100000; ++i)
    header += ",\"z." + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[8,8]})";
  write_raw(path("many.safetensors"), header + "}", std::string(8, '\0'));
  EXPECT_EQ(SafeTensorsReader::open(path("many.safetensors")).names().size(), 100001u);
  write_raw(path("many_twice.safetensors"), header + R"(,"z.99999":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
            std::string(8, '\0'));
  expect_open_error(path("many_twice.safetensors"), {"many_twice.safetensors", "\"z.99999\"", "twice"});
  write_raw(path("nested.safetensors"), R"({"__metadata__":{"a":"1"},"w":)" + good_entry() + "}", std::string(8, '\0'));
  EXPECT_NO_THROW(SafeTensorsReader::open(path("nested.safetensors")));
}

// Bytes the JSON parser never reads (after a NUL) or skips (a byte-order mark) are refused: the
// header was accepted with garbage after a NUL.
TEST_F(SafeTensorsBadInput, NulOrByteOrderMarkInHeader) {
  write_raw(path("nul.safetensors"), R"({"w":)" + good_entry() + std::string("}\0GARBAGE{{{", 12), std::string(8, '\0'));
  expect_open_error(path("nul.safetensors"), {"nul.safetensors", "NUL byte at offset"});
  write_raw(path("bom.safetensors"), "\xEF\xBB\xBF{\"w\":" + good_entry() + "}", std::string(8, '\0'));
  expect_open_error(path("bom.safetensors"), {"bom.safetensors", "byte-order mark"});
  // Spaces after the JSON (how writers align the data) stay allowed.
  write_raw(path("spaces.safetensors"), R"({"w":)" + good_entry() + "}    ", std::string(8, '\0'));
  EXPECT_NO_THROW(SafeTensorsReader::open(path("spaces.safetensors")));
}

// A FIFO in a model folder is refused at once; opening one waited for a writer forever.
TEST_F(SafeTensorsBadInput, FifoIsRefusedNotWaitedOn) {
  ASSERT_EQ(0, ::mkfifo(path("fifo.safetensors").c_str(), 0644));
  expect_open_error(path("fifo.safetensors"), {"fifo.safetensors", "not a regular file"});
  ASSERT_EQ(0, ::mkfifo(path("config.json").c_str(), 0644));
  expect_error([&] { io::read_text_file(path("config.json"), "model config"); },
               {"model config", "config.json", "not a regular file"});
  expect_error([&] { io::read_text_file("/dev/zero", "tokenizer"); }, {"tokenizer /dev/zero", "not a regular file"});
}

TEST_F(SafeTensorsBadInput, BadMetadata) {
  write_raw(path("meta.safetensors"), R"({"__metadata__":{"format":1},"w":)" + good_entry() + "}",
            std::string(8, '\0'));
  expect_open_error(path("meta.safetensors"), {"meta.safetensors", "__metadata__", "format"});
}

TEST_F(SafeTensorsBadInput, DuplicateAcrossShards) {
  const std::string dir = path("dup");
  fs::create_directories(dir);
  write_raw(dir + "/s1.safetensors", R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  write_raw(dir + "/s2.safetensors", R"({"w":)" + good_entry() + R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors","v":"s2.safetensors"}})");
  expect_open_error(dir, {"\"w\"", "s1.safetensors", "s2.safetensors", "two shards"});
}

// "s1.safetensors" and "./s1.safetensors" are one shard: they were read as two, both holding "w".
TEST_F(SafeTensorsBadInput, OneShardSpelledTwoWaysIsOneShard) {
  const std::string dir = path("spelled");
  fs::create_directories(dir);
  write_raw(dir + "/s1.safetensors", R"({"w":)" + good_entry() + R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors","v":"./s1.safetensors"}})");
  EXPECT_EQ(SafeTensorsReader::open(dir).names().size(), 2u);
}

// A link whose target is gone (a Hugging Face cache snapshot whose blob was deleted) is named as
// one; the folder was said to hold neither file.
TEST_F(SafeTensorsBadInput, DanglingLinkIsNamed) {
  const std::string dir = path("dangling");
  fs::create_directories(dir);
  fs::create_symlink(path("gone.safetensors"), dir + "/model.safetensors");
  expect_open_error(dir, {dir + "/model.safetensors", "symbolic link to", "gone.safetensors", "does not exist"});
  fs::remove(dir + "/model.safetensors");
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors"}})");
  fs::create_symlink(path("gone.safetensors"), dir + "/s1.safetensors");
  expect_open_error(dir, {"s1.safetensors", "symbolic link to", "gone.safetensors", "does not exist"});
  // A link that leads back to itself is a loop, not a link to a missing file.
  fs::remove(dir + "/s1.safetensors");
  fs::create_symlink("s1.safetensors", dir + "/s1.safetensors");
  expect_open_error(dir, {"s1.safetensors (for tensor \"w\"), a symbolic link loop"});
}

TEST_F(SafeTensorsBadInput, IndexNamesMissingShard) {
  const std::string dir = path("missing_shard");
  fs::create_directories(dir);
  write_raw(dir + "/s1.safetensors", R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors","v":"s9.safetensors"}})");
  expect_open_error(dir, {"model.safetensors.index.json", "s9.safetensors", "\"v\"", "does not exist"});
}

// Shards outside the model's folder (an absolute path, a ".." step) are refused, even when the
// file exists and holds the tensor; a subfolder of the model's folder is fine.
TEST_F(SafeTensorsBadInput, IndexNamesShardOutsideTheFolder) {
  const std::string dir = path("escaping/model");
  fs::create_directories(dir + "/sub");
  write_raw(path("escaping/s1.safetensors"), R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  for (const std::string& shard : {std::string("../s1.safetensors"), std::string("sub/../../s1.safetensors"),
                                   fs::absolute(path("escaping/s1.safetensors")).string()}) {
    write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":")" + shard + R"("}})");
    expect_open_error(dir, {"model.safetensors.index.json", "\"w\"", shard, "lies outside the model's folder"});
  }
  write_raw(dir + "/sub/s1.safetensors", R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"sub/s1.safetensors"}})");
  EXPECT_NO_THROW(SafeTensorsReader::open(dir));
}

TEST_F(SafeTensorsBadInput, IndexNamesTensorShardLacks) {
  const std::string dir = path("lacking_shard");
  fs::create_directories(dir);
  write_raw(dir + "/s1.safetensors", R"({"w":)" + good_entry() + "}", std::string(8, '\0'));
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":{"w":"s1.safetensors","v":"s1.safetensors"}})");
  expect_open_error(dir, {"model.safetensors.index.json", "s1.safetensors", "\"v\"", "does not contain"});
  write_bytes(dir + "/model.safetensors.index.json", R"({"metadata":{}})");
  expect_open_error(dir, {"model.safetensors.index.json", "weight_map"});
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map":)");
  expect_open_error(dir, {"model.safetensors.index.json", "not valid JSON"});
}

TEST_F(SafeTensorsBadInput, ReadIntoChecksShapeAndDtype) {
  const std::string p = path("ok.safetensors");
  HostTensor<float> w(DType::f32, {2, 3});
  HostTensor<int64_t> ids(DType::i64, {2});
  ids.storage = {5, int64_t{1} << 40};
  write_safetensors(p, {{"model.w", w.tensor, DType::bf16}, {"ids", ids.tensor, DType::i64}});
  auto reader = SafeTensorsReader::open(p);
  HostTensor<float> wrong(DType::f32, {3, 2});
  expect_error([&] { reader.read_into("model.w", wrong.tensor); }, {"\"model.w\"", "ok.safetensors", "(2,3)", "(3,2)"});
  HostTensor<float> flat(DType::f32, {6});
  expect_error([&] { reader.read_into("model.w", flat.tensor); }, {"\"model.w\"", "(2,3)", "(6)"});
  HostTensor<int32_t> as_int(DType::i32, {2, 3});
  expect_error([&] { reader.read_into("model.w", as_int.tensor); }, {"\"model.w\"", "ok.safetensors", "BF16", "i32"});
  HostTensor<int32_t> narrow(DType::i32, {2});
  expect_error([&] { reader.read_into("ids", narrow.tensor); }, {"\"ids\"", "ok.safetensors", "i32"});
  expect_error([&] { reader.get("model.missing"); }, {"\"model.missing\"", "ok.safetensors"});
  EXPECT_FALSE(reader.contains("model.missing"));
  EXPECT_TRUE(reader.contains("model.w"));
}

TEST_F(SafeTensorsBadInput, WriterRejectsBadInput) {
  HostTensor<float> w(DType::f32, {2});
  expect_error([&] { write_safetensors(path("dup.safetensors"), {{"a", w.tensor, DType::f32}, {"a", w.tensor, DType::f32}}); },
               {"dup.safetensors", "\"a\"", "twice"});
  expect_error([&] { write_safetensors(path("conv.safetensors"), {{"a", w.tensor, DType::i32}}); },
               {"conv.safetensors", "\"a\"", "I32"});
  // Sharded: nothing is written when any tensor is bad, even one destined for a later shard.
  HostTensor<int64_t> big(DType::i64, {1});
  big.storage = {int64_t{1} << 35};
  expect_error([&] { write_safetensors_sharded(path("sharded"), {{"a", w.tensor, DType::f32}, {"z", big.tensor, DType::i32}}, 8); },
               {"sharded", "\"z\"", "I32"});
  EXPECT_FALSE(fs::exists(path("sharded")));
  EXPECT_FALSE(fs::exists(path("dup.safetensors")));
  EXPECT_FALSE(fs::exists(path("conv.safetensors")));
}

}  // namespace
}  // namespace ingot::io
