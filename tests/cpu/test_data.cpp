// Data layer tests: shard format round trip and corruption, DataLoader windows / split / shuffle /
// resume / masking, ByteTokenizer, prepare on small corpora.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <streambuf>
#include <utility>

#include "ingot/core/error.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/byte_tokenizer.h"
#include "ingot/data/loader.h"
#include "ingot/data/prepare.h"
#include "ingot/data/shard.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;
using namespace ingot::data;
using test::error_of;

namespace {

void write_text(const fs::path& path, std::string_view text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Every token of a shard, in order.
std::vector<int32_t> shard_tokens(const Shard& s) {
  std::vector<int32_t> tokens(s.num_tokens());
  s.read_tokens(0, s.num_tokens(), tokens.data());
  return tokens;
}

// A shard whose token at stream position p is p (+ offset), so a row's first input names its
// window.
ShardData counting_shard(int64_t n, int64_t offset, int64_t doc_len) {
  ShardData d;
  d.tokens.resize(n);
  std::iota(d.tokens.begin(), d.tokens.end(), static_cast<int32_t>(offset));
  for (int64_t s = 0; s < n; s += doc_len) d.document_starts.push_back(s);
  d.vocab_size = 0;
  d.token_width = 4;
  return d;
}

struct Batch {
  int64_t B, T;
  std::vector<int32_t> inputs, targets, positions, segments;
  Batch(int64_t b, int64_t t)
      : B(b), T(t), inputs(b * t), targets(b * t), positions(b * t, -1), segments(b * t, -1) {}
  BatchBuffers buffers() {
    return {inputs.data(), targets.data(), positions.data(), segments.data()};
  }
};

DataLoaderConfig counting_config(const std::string& file, int64_t T, uint64_t seed,
                                 double val_fraction = 0.1) {
  DataLoaderConfig c;
  c.paths = {file};
  c.seq_len = T;
  c.vocab_size = 1 << 20;
  c.val_fraction = val_fraction;
  c.seed = seed;
  return c;
}

// Window starts of the next `batches` batches.
std::vector<int32_t> next_starts(DataLoader& loader, int64_t batches, int64_t B) {
  Batch batch(B, loader.seq_len());
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < batches; ++i) {
    loader.next_batch(B, batch.buffers());
    for (int64_t b = 0; b < B; ++b) starts.push_back(batch.inputs[b * batch.T]);
  }
  return starts;
}

// Options that prepare one file, dir/a.txt holding `text` (written here), into dir/out.
PrepareOptions one_file_into_out(const std::string& dir, const std::string& text) {
  write_text(dir + "/a.txt", text);
  PrepareOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output_dir = dir + "/out";
  return o;
}

// The id of a process that has ended (a shell that printed its own): what a killed prepare's
// .prepare-<pid> folder is named after.
std::string ended_process_id() {
  std::string pid;
  if (test::run_command("sh -c 'echo $$'", &pid) != 0) return "";
  return pid.substr(0, pid.find_first_not_of("0123456789"));
}

}  // namespace

// ---------------------------------------------------------------- shards

class ShardRoundTrip : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(ShardRoundTrip, WriteReadIdentical) {
  const auto [width, with_mask] = GetParam();
  const std::string dir = test::temp_dir("shard_round_trip");
  ShardData d;
  const int32_t top = width == 2 ? 65535 : 1000000;
  for (int i = 0; i < 1001; ++i) d.tokens.push_back((i * 7919) % (top + 1));
  d.tokens.back() = top;
  d.document_starts = {0, 3, 500, 1000};
  if (with_mask)
    for (int i = 0; i < 1001; ++i) d.loss_mask.push_back(i % 3 == 0);
  d.vocab_size = width == 2 ? 65536 : 1000001;
  d.token_width = width;
  const std::string path = dir + "/s.bin";
  write_shard(path, d);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  Shard s(path);
  EXPECT_EQ(s.token_width(), width);
  EXPECT_EQ(s.num_tokens(), 1001);
  EXPECT_EQ(s.num_documents(), 4);
  EXPECT_EQ(s.vocab_size(), d.vocab_size);
  EXPECT_EQ(s.has_loss_mask(), with_mask);
  std::vector<int32_t> tokens(1001);
  s.read_tokens(0, 1001, tokens.data());
  EXPECT_EQ(tokens, d.tokens);
  EXPECT_EQ(std::vector<uint64_t>(s.document_starts().begin(), s.document_starts().end()),
            d.document_starts);
  EXPECT_EQ(std::vector<uint8_t>(s.loss_mask().begin(), s.loss_mask().end()), d.loss_mask);
  // Exact size: 40-byte header, padded token section, offsets, padded mask.
  const uint64_t tokens_end = (40 + 1001 * width + 7) / 8 * 8;
  const uint64_t expected = tokens_end + 4 * 8 + (with_mask ? (1001 + 7) / 8 * 8 : 0);
  EXPECT_EQ(fs::file_size(path), expected);
  EXPECT_EQ(s.find_token_at_least(top), 1000);
  EXPECT_EQ(s.find_token_at_least(uint64_t(top) + 1), -1);
}

INSTANTIATE_TEST_SUITE_P(Widths, ShardRoundTrip,
                         ::testing::Combine(::testing::Values(2u, 4u), ::testing::Bool()));

TEST(Shard, HeaderBytesMatchTheSpec) {
  const std::string dir = test::temp_dir("shard_header");
  write_shard(dir + "/s.bin", {{5, 6, 7}, {0, 2}, {1, 0, 1}, 257, 2});
  const std::string bytes = test::read_file(dir + "/s.bin");
  ASSERT_EQ(bytes.size(), 40u + 8 + 16 + 8);
  EXPECT_EQ(bytes.substr(0, 8), "INGOTTOK");
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  EXPECT_EQ(u32(8), 1u);     // version
  EXPECT_EQ(u32(12), 2u);    // token width
  EXPECT_EQ(u64(16), 3u);    // tokens
  EXPECT_EQ(u64(24), 2u);    // documents
  EXPECT_EQ(u32(32), 1u);    // flags: loss mask
  EXPECT_EQ(u32(36), 257u);  // vocab
  EXPECT_EQ(bytes[40], 5);
  EXPECT_EQ(bytes[44], 7);
  EXPECT_EQ(u64(48), 0u);
  EXPECT_EQ(u64(56), 2u);
  EXPECT_EQ(bytes.substr(64, 8), std::string("\1\0\1\0\0\0\0\0", 8));
}

TEST(Shard, CorruptFilesNameTheFile) {
  const std::string dir = test::temp_dir("shard_corrupt");
  const std::string good = dir + "/good.bin";
  write_shard(good, {{1, 2, 3, 4, 5}, {0, 2}, {}, 257, 2});
  const std::string bytes = test::read_file(good);

  const std::string bad_magic = dir + "/bad_magic.bin";
  write_text(bad_magic, "NOTATOK!" + bytes.substr(8));
  std::string msg = error_of([&] { Shard s(bad_magic); });
  EXPECT_NE(msg.find(bad_magic), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;

  const std::string truncated = dir + "/truncated.bin";
  write_text(truncated, bytes.substr(0, bytes.size() - 8));
  msg = error_of([&] { Shard s(truncated); });
  EXPECT_NE(msg.find(truncated), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  const std::string tiny = dir + "/tiny.bin";
  write_text(tiny, "INGOT");
  msg = error_of([&] { Shard s(tiny); });
  EXPECT_NE(msg.find(tiny), std::string::npos) << msg;

  std::string v2 = bytes;
  v2[8] = 2;
  write_text(dir + "/v2.bin", v2);
  msg = error_of([&] { Shard s(dir + "/v2.bin"); });
  EXPECT_NE(msg.find("version 2"), std::string::npos) << msg;

  // 2-byte tokens with a vocabulary past 65536, which the writer refuses, is a corrupt header.
  std::string wide_vocab = bytes;
  const uint32_t vocab = 70000;
  std::memcpy(wide_vocab.data() + 36, &vocab, 4);
  write_text(dir + "/wide_vocab.bin", wide_vocab);
  msg = error_of([&] { Shard s(dir + "/wide_vocab.bin"); });
  EXPECT_NE(msg.find(dir + "/wide_vocab.bin: header records a vocabulary of 70000 with 2-byte tokens"), std::string::npos)
      << msg;

  std::string descending = bytes;  // document starts at 56: make the second one 0
  std::memset(descending.data() + 64, 0, 8);
  write_text(dir + "/descending.bin", descending);
  msg = error_of([&] { Shard s(dir + "/descending.bin"); });
  EXPECT_NE(msg.find("ascending"), std::string::npos) << msg;

  std::string late_first = bytes;  // the first document must start at token 0
  const uint64_t one = 1;
  std::memcpy(late_first.data() + 56, &one, 8);
  write_text(dir + "/late_first.bin", late_first);
  msg = error_of([&] { Shard s(dir + "/late_first.bin"); });
  EXPECT_NE(msg.find("shard " + dir + "/late_first.bin: first document starts at 1, not 0"), std::string::npos) << msg;

  std::string past_end = bytes;  // a document starting at token 5 of 5 would be empty
  const uint64_t five = 5;
  std::memcpy(past_end.data() + 64, &five, 8);
  write_text(dir + "/past_end.bin", past_end);
  msg = error_of([&] { Shard s(dir + "/past_end.bin"); });
  EXPECT_NE(msg.find("shard " + dir + "/past_end.bin: document 1 starts at 5, past the last token (5 tokens)"),
            std::string::npos) << msg;

  // Counts that fit the file's size but not each other: a document and no tokens (header and one
  // start, 48 bytes), tokens and no documents (header and 5 tokens padded to 16, 56 bytes).
  auto with_counts = [&](uint64_t tokens, uint64_t documents, const std::string& body) {
    std::string header = bytes.substr(0, 40);
    std::memcpy(header.data() + 16, &tokens, 8);
    std::memcpy(header.data() + 24, &documents, 8);
    return header + body;
  };
  write_text(dir + "/no_tokens.bin", with_counts(0, 1, std::string(8, '\0')));
  msg = error_of([&] { Shard s(dir + "/no_tokens.bin"); });
  EXPECT_NE(msg.find("shard " + dir + "/no_tokens.bin: 1 documents but no tokens"), std::string::npos) << msg;
  write_text(dir + "/no_starts.bin", with_counts(5, 0, bytes.substr(40, 16)));
  msg = error_of([&] { Shard s(dir + "/no_starts.bin"); });
  EXPECT_NE(msg.find("shard " + dir + "/no_starts.bin: 5 tokens but no document starts"), std::string::npos) << msg;

  msg = error_of([&] { Shard s(dir + "/missing.bin"); });
  EXPECT_NE(msg.find(dir + "/missing.bin"), std::string::npos) << msg;

  // A token count one short fits the same file (7 and 6 two-byte tokens both pad to 56 bytes): the
  // last token, left in the padding, was dropped unseen.
  write_shard(dir + "/seven.bin", {{1, 2, 3, 4, 5, 6, 7}, {0, 2}, {}, 257, 2});
  std::string short_count = test::read_file(dir + "/seven.bin");
  const uint64_t six = 6;
  std::memcpy(short_count.data() + 16, &six, 8);
  write_text(dir + "/short_count.bin", short_count);
  msg = error_of([&] { Shard s(dir + "/short_count.bin"); });
  EXPECT_NE(msg.find("shard " + dir + "/short_count.bin: the padding after the tokens holds a non-zero byte at offset 52"),
            std::string::npos) << msg;
  EXPECT_NO_THROW(Shard s(dir + "/seven.bin"));
}

TEST(Shard, WriterRejectsBadInput) {
  const std::string dir = test::temp_dir("shard_writer");
  std::string msg = error_of([&] { write_shard(dir + "/a.bin", {{1, 300}, {0}, {}, 257, 2}); });
  EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  msg = error_of([&] { write_shard(dir + "/b.bin", {{1, 70000}, {0}, {}, 0, 2}); });
  EXPECT_NE(msg.find("70000"), std::string::npos) << msg;
  msg = error_of([&] { write_shard(dir + "/c.bin", {{1, 2}, {0}, {1, 2}, 0, 2}); });
  EXPECT_NE(msg.find("loss mask"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/a.bin"));
  EXPECT_FALSE(fs::exists(dir + "/a.bin.tmp"));
}

// ---------------------------------------------------------------- loader

TEST(DataLoader, TokenOutsideVocabNamesFileIndexValue) {
  const std::string dir = test::temp_dir("loader_vocab");
  ShardData d{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {0}, {}, 1000, 2};
  d.tokens[6] = 999;
  write_shard(dir + "/train-00000.bin", d);
  DataLoaderConfig c;
  c.paths = {dir};
  c.seq_len = 4;
  c.vocab_size = 257;
  const std::string msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(msg.find(dir + "/train-00000.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("999"), std::string::npos) << msg;
  EXPECT_NE(msg.find("index 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("257"), std::string::npos) << msg;
}

// A shard whose ids run past the vocabulary its own header records is damaged, even where the
// model's larger vocabulary would take them (it used to train on them).
TEST(DataLoader, TokenOutsideTheShardsOwnVocabIsRefused) {
  const std::string dir = test::temp_dir("loader_shard_vocab");
  const std::string path = dir + "/train-00000.bin";
  write_shard(path, {{1, 2, 3, 4, 5, 6, 300, 8, 9, 10}, {0}, {}, 1000, 2});
  {  // the header now says 257, which id 300 is past (the writer refuses to write such a shard)
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t vocab = 257;
    f.seekp(36);
    f.write(reinterpret_cast<const char*>(&vocab), 4);
  }
  DataLoaderConfig c;
  c.paths = {dir};
  c.seq_len = 4;
  c.vocab_size = 1024;
  const std::string msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(msg.find("data: shard " + path + ": token id 300 at token index 6 is not below the vocabulary of 257 its "
                     "header records"),
            std::string::npos)
      << msg;
  c.vocab_size = 280;  // past the model's too: that is the message
  const std::string model_msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(model_msg.find("is not below the model's vocab size 280; the shard was written for a vocabulary of 257"),
            std::string::npos)
      << model_msg;
  c.vocab_size = 256;  // below the shard's own: the model's bound comes first
  const std::string small_msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(small_msg.find("token id 300 at token index 6 is not below the model's vocab size 256"), std::string::npos)
      << small_msg;
}

// Shards from two tokenizers (bad-input review of 2026-12-01: a byte-level and a BPE dataset trained
// together with exit 0). A shard that records no vocabulary (0) mixes with either.
TEST(DataLoader, RefusesShardsOfTwoTokenizers) {
  const std::string dir = test::temp_dir("loader_two_tokenizers");
  write_shard(dir + "/bytes.bin", {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {0}, {}, 257, 2});
  write_shard(dir + "/bpe.bin", {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {0}, {}, 515, 2});
  write_shard(dir + "/unknown.bin", {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {0}, {}, 0, 2});
  DataLoaderConfig c;
  c.seq_len = 4;
  c.vocab_size = 1024;
  c.paths = {dir + "/bytes.bin", dir + "/unknown.bin"};
  EXPECT_NO_THROW(DataLoader loader(c));
  c.paths = {dir + "/bytes.bin", dir + "/unknown.bin", dir + "/bpe.bin"};
  const std::string msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(msg.find("shard " + dir + "/bpe.bin was written by a tokenizer of vocabulary 515, shard " + dir +
                     "/bytes.bin by one of vocabulary 257: train_data must come from one tokenizer"),
            std::string::npos)
      << msg;
}

TEST(DataLoader, TooShortDatasetIsAnError) {
  const std::string dir = test::temp_dir("loader_short");
  write_shard(dir + "/a.bin", counting_shard(8, 0, 8));
  auto c = counting_config(dir + "/a.bin", 8, 0, 0.0);
  std::string msg = error_of([&] { DataLoader loader(c); });
  EXPECT_NE(msg.find("too short"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs at least 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir + "/a.bin"), std::string::npos) << msg;

  // 9 tokens make one training window without validation, but not with it.
  write_shard(dir + "/b.bin", counting_shard(9, 0, 9));
  DataLoader ok(counting_config(dir + "/b.bin", 8, 0, 0.0));
  EXPECT_EQ(ok.num_train_windows(), 1);
  msg = error_of([&] { DataLoader loader(counting_config(dir + "/b.bin", 8, 0, 0.05)); });
  EXPECT_NE(msg.find("needs at least 18"), std::string::npos) << msg;
  write_shard(dir + "/c.bin", counting_shard(18, 0, 18));
  DataLoader with_val(counting_config(dir + "/c.bin", 8, 0, 0.05));
  EXPECT_EQ(with_val.num_train_windows(), 1);
  EXPECT_EQ(with_val.num_val_windows(), 1);
}

TEST(DataLoader, WindowsAreShiftedInputsAndTargets) {
  const std::string dir = test::temp_dir("loader_windows");
  // Two shards; windows straddle their boundary.
  write_shard(dir + "/train-00000.bin", counting_shard(37, 0, 10));
  write_shard(dir + "/train-00001.bin", counting_shard(64, 37, 10));
  DataLoaderConfig c = counting_config(dir, 8, 3, 0.1);
  DataLoader loader(c);
  EXPECT_EQ(loader.files().size(), 2u);
  EXPECT_EQ(loader.num_tokens(), 101);
  // 12 windows fit in 101 tokens; 1 is validation; train gets what fits before it and a gap token.
  EXPECT_EQ(loader.num_val_windows(), 1);
  EXPECT_EQ(loader.num_train_windows(), 11);
  Batch batch(5, 8);
  for (int step = 0; step < 5; ++step) {
    loader.next_batch(5, batch.buffers());
    for (int64_t b = 0; b < 5; ++b) {
      const int32_t start = batch.inputs[b * 8];
      EXPECT_EQ(start % 8, 0);
      for (int64_t t = 0; t < 8; ++t) {
        EXPECT_EQ(batch.inputs[b * 8 + t], start + t);
        EXPECT_EQ(batch.targets[b * 8 + t], start + t + 1);
        EXPECT_EQ(batch.positions[b * 8 + t], t);
        EXPECT_EQ(batch.segments[b * 8 + t], 0);
      }
    }
  }
}

TEST(DataLoader, SameSeedSameBatchesDifferentSeedDifferentOrder) {
  const std::string dir = test::temp_dir("loader_seed");
  write_shard(dir + "/a.bin", counting_shard(16 * 200 + 1, 0, 100));
  DataLoader a(counting_config(dir + "/a.bin", 16, 7));
  DataLoader b(counting_config(dir + "/a.bin", 16, 7));
  DataLoader c(counting_config(dir + "/a.bin", 16, 8));
  const auto sa = next_starts(a, 30, 4), sb = next_starts(b, 30, 4), sc = next_starts(c, 30, 4);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  // The order is shuffled, not sequential.
  EXPECT_FALSE(std::is_sorted(sa.begin(), sa.end()));
}

TEST(DataLoader, ShuffleIsPinned) {
  // The permutation is fully specified (mt19937_64 + our Fisher-Yates): pin it so that a change of
  // algorithm, which would break resuming old runs, shows up here.
  const std::string dir = test::temp_dir("loader_pinned");
  write_shard(dir + "/a.bin", counting_shard(4 * 10 + 1, 0, 41));
  DataLoader loader(counting_config(dir + "/a.bin", 4, 42, 0.0));
  std::vector<int64_t> order;
  for (int64_t i = 0; i < loader.num_train_windows(); ++i)
    order.push_back(loader.train_window_at(0, i));
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(10);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  // Recorded once from this implementation.
  const std::vector<int64_t> expected = {1, 7, 9, 0, 3, 8, 4, 2, 5, 6};
  EXPECT_EQ(order, expected) << ::testing::PrintToString(order);
  // And the specification (docs/data-format.md), written out here: std::mt19937_64 seeded with
  // seed + epoch * 0x9e3779b97f4a7c15 (its stream is fixed by the C++ standard), Fisher-Yates from
  // the last position down, position i swapped with one drawn uniformly from [0, i] by rejecting
  // draws below 2^64 mod (i + 1).
  for (const uint64_t epoch : {0, 1, 2}) {
    std::mt19937_64 rng(42 + epoch * 0x9e3779b97f4a7c15ull);
    std::vector<int64_t> spec(10);
    std::iota(spec.begin(), spec.end(), 0);
    for (uint64_t i = spec.size() - 1; i > 0; --i) {
      const uint64_t range = i + 1, biased_below = static_cast<uint64_t>((static_cast<unsigned __int128>(1) << 64) % range);
      uint64_t draw = rng();
      while (draw < biased_below) draw = rng();
      std::swap(spec[i], spec[draw % range]);
    }
    std::vector<int64_t> got;
    for (int64_t i = 0; i < loader.num_train_windows(); ++i) got.push_back(loader.train_window_at(epoch, i));
    EXPECT_EQ(got, spec) << "epoch " << epoch;
  }
}

// Seed s + 1's order is not seed s's next epoch (with seed + epoch it was: a sweep over adjacent
// seeds trained every multi-epoch run on shifted copies of one order). A state saved before the
// stride (no epoch_seed_stride key) keeps seed + epoch, so the run it resumes keeps its order.
TEST(DataLoader, AdjacentSeedsDoNotShareEpochs) {
  const std::string dir = test::temp_dir("loader_adjacent_seeds");
  write_shard(dir + "/a.bin", counting_shard(4 * 40 + 1, 0, 161));
  DataLoader s42(counting_config(dir + "/a.bin", 4, 42, 0.0)), s43(counting_config(dir + "/a.bin", 4, 43, 0.0));
  auto order = [](DataLoader& loader, int64_t epoch) {
    std::vector<int64_t> o;
    for (int64_t i = 0; i < loader.num_train_windows(); ++i) o.push_back(loader.train_window_at(epoch, i));
    return o;
  };
  EXPECT_NE(order(s42, 1), order(s43, 0));
  EXPECT_NE(order(s42, 2), order(s43, 1));

  nlohmann::json old_state = s42.save_state();
  EXPECT_EQ(old_state.at("epoch_seed_stride").get<uint64_t>(), kEpochSeedStride);
  old_state.erase("epoch_seed_stride");
  old_state["epoch"] = 1;
  old_state["index"] = 0;
  DataLoader resumed(counting_config(dir + "/a.bin", 4, 42, 0.0));
  resumed.restore_state(old_state);
  EXPECT_EQ(order(resumed, 1), order(s43, 0));  // the old formula: 42 + 1
  EXPECT_EQ(resumed.save_state().at("epoch_seed_stride").get<uint64_t>(), 1u);
  old_state["epoch_seed_stride"] = 7;
  const std::string msg = error_of([&] { resumed.restore_state(old_state); });
  EXPECT_NE(msg.find("epoch_seed_stride 7"), std::string::npos) << msg;
}

TEST(DataLoader, EveryTrainWindowOncePerEpochAndDisjointFromValidation) {
  const std::string dir = test::temp_dir("loader_epoch");
  const int64_t T = 16;
  write_shard(dir + "/a.bin", counting_shard(T * 103 + 5, 0, 50));
  DataLoader loader(counting_config(dir + "/a.bin", T, 11, 0.05));
  const int64_t n = loader.num_train_windows();
  EXPECT_EQ(loader.num_val_windows(), 5);  // floor(103 * 0.05)
  EXPECT_EQ(n, 98);                        // (1653 - 2 - 5 * 16) / 16
  // Batches of 7 do not divide 97: epochs roll over mid-batch.
  const auto starts = next_starts(loader, (2 * n + 6) / 7, 7);
  ASSERT_GE(starts.size(), size_t(2 * n));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> seen(starts.begin() + epoch * n, starts.begin() + (epoch + 1) * n);
    EXPECT_EQ(seen.size(), size_t(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(seen.count(int32_t(i * T))) << i;
  }
  EXPECT_NE(std::vector<int32_t>(starts.begin(), starts.begin() + n),
            std::vector<int32_t>(starts.begin() + n, starts.begin() + 2 * n));

  // Validation windows in order, and no token shared with any train window.
  ValIterator val = loader.validation();
  Batch batch(3, T);
  std::vector<int32_t> val_tokens;
  int64_t rows = 0, real;
  while ((real = val.next_batch(3, batch.buffers())) > 0) {
    for (int64_t b = 0; b < 3; ++b) {
      if (b >= real) {
        EXPECT_EQ(batch.targets[b * T], kIgnoreIndex);
        continue;
      }
      EXPECT_EQ(batch.inputs[b * T], loader.val_window_start(rows));
      for (int64_t t = 0; t < T; ++t) val_tokens.push_back(batch.inputs[b * T + t]);
      val_tokens.push_back(batch.targets[b * T + T - 1]);
      ++rows;
    }
  }
  EXPECT_EQ(rows, 5);
  const int64_t last_train_token = (n - 1) * T + T;
  for (int32_t tok : val_tokens) EXPECT_GT(tok, last_train_token);
  EXPECT_LT(val_tokens.back(), loader.num_tokens());
  val.reset();
  EXPECT_EQ(val.next_batch(3, batch.buffers()), 3);
  EXPECT_EQ(batch.inputs[0], loader.val_window_start(0));
}

TEST(DataLoader, CursorSaveRestoreResumesExactly) {
  const std::string dir = test::temp_dir("loader_resume");
  write_shard(dir + "/a.bin", counting_shard(8 * 50 + 3, 0, 20));
  const auto config = counting_config(dir + "/a.bin", 8, 5);
  DataLoader first(config);
  next_starts(first, 9, 4);  // mid-epoch (45 train windows)
  const nlohmann::json state = first.save_state();
  EXPECT_EQ(state.at("epoch"), 0);
  EXPECT_EQ(state.at("index"), 36);
  const auto expected = next_starts(first, 20, 4);  // crosses into epoch 1 and 2

  DataLoader resumed(config);
  resumed.restore_state(nlohmann::json::parse(state.dump()));
  EXPECT_EQ(next_starts(resumed, 20, 4), expected);
  EXPECT_EQ(resumed.save_state(), first.save_state());

  // A checkpoint at the very end of an epoch (45 windows, 5 batches of 9) holds index 45: it
  // resumes into the next epoch as the run that went on did (it was one index from being refused
  // as out of range, and no test held it).
  DataLoader at_end(config);
  next_starts(at_end, 9, 5);
  const nlohmann::json end_state = at_end.save_state();
  EXPECT_EQ(end_state.at("epoch"), 0);
  EXPECT_EQ(end_state.at("index"), 45);
  const auto after_end = next_starts(at_end, 9, 2);
  DataLoader resumed_at_end(config);
  resumed_at_end.restore_state(nlohmann::json::parse(end_state.dump()));
  EXPECT_EQ(next_starts(resumed_at_end, 9, 2), after_end);

  DataLoader other_seed(counting_config(dir + "/a.bin", 8, 6));
  std::string msg = error_of([&] { other_seed.restore_state(state); });
  EXPECT_NE(msg.find("seed"), std::string::npos) << msg;
  // An epoch at the top of int64 overflowed at the next pass (signed overflow; the next checkpoint
  // then held a negative epoch).
  nlohmann::json last_epoch = state;
  last_epoch["epoch"] = std::numeric_limits<int64_t>::max();
  msg = error_of([&] { DataLoader(config).restore_state(last_epoch); });
  EXPECT_NE(msg.find("data: saved loader cursor (epoch 9223372036854775807, index 36) is out of range"), std::string::npos)
      << msg;
}

TEST(DataLoader, TargetsMaskedWhereLossMaskIsZero) {
  const std::string dir = test::temp_dir("loader_mask");
  ShardData d = counting_shard(41, 0, 41);
  for (int i = 0; i < 41; ++i) d.loss_mask.push_back(i % 3 != 0);
  write_shard(dir + "/masked.bin", d);
  write_shard(dir + "/plain.bin", counting_shard(40, 41, 40));  // no mask: everything trains
  DataLoaderConfig c = counting_config(dir, 8, 1, 0.0);
  DataLoader loader(c);
  EXPECT_EQ(loader.num_train_windows(), 10);
  Batch batch(10, 8);
  loader.next_batch(10, batch.buffers());
  int masked = 0;
  for (int64_t i = 0; i < 80; ++i) {
    const int32_t target_pos = batch.inputs[i] + 1;
    const bool keep = target_pos >= 41 || target_pos % 3 != 0;
    EXPECT_EQ(batch.targets[i], keep ? target_pos : kIgnoreIndex) << i;
    masked += !keep;
  }
  EXPECT_EQ(masked, 13);  // target positions 3, 6, ..., 39 (position 0 is never a target)
}

// A dataset whose loss mask is 0 everywhere has nothing to train on: refused at load, naming the
// files (it used to train with loss 0 and report success). Without the mask the same tokens train.
TEST(DataLoader, RefusesDataWithoutAnyTarget) {
  const std::string dir = test::temp_dir("loader_no_target");
  ShardData d = counting_shard(41, 0, 41);
  d.loss_mask.assign(41, 0);
  write_shard(dir + "/masked.bin", d);
  const std::string msg = error_of([&] { DataLoader loader(counting_config(dir, 8, 1, 0.0)); });
  EXPECT_NE(msg.find("no token of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("masked.bin"), std::string::npos) << msg;
  DataLoaderConfig all_tokens = counting_config(dir, 8, 1, 0.0);
  all_tokens.use_loss_mask = false;  // train_on_inputs: true
  EXPECT_EQ(DataLoader(all_tokens).num_train_windows(), 5);

  // Targets only in the validation tail (stream: 7 training windows of 8 over tokens 1-56, 2
  // validation windows after): every step trained nothing, and the run exited 0.
  ShardData tail = counting_shard(81, 0, 81);
  tail.loss_mask.assign(81, 0);
  for (int i = 70; i < 81; ++i) tail.loss_mask[i] = 1;
  write_shard(dir + "/masked.bin", tail);
  const std::string tail_msg = error_of([&] { DataLoader loader(counting_config(dir, 8, 1, 0.2)); });
  EXPECT_NE(tail_msg.find("falls in the training windows (tokens 1 to 56 of the stream) before the validation tail "
                          "(val_fraction 0.2): the loss would count no token of any step"), std::string::npos) << tail_msg;
  tail.loss_mask[56] = 1;  // the last training target
  write_shard(dir + "/masked.bin", tail);
  EXPECT_EQ(DataLoader(counting_config(dir, 8, 1, 0.2)).num_train_windows(), 7);
}

// A FIFO named as a shard: refused, not opened (opening one waits for a writer forever).
TEST(DataLoader, RefusesAShardThatIsNotARegularFile) {
  const std::string dir = test::temp_dir("loader_fifo");
  const std::string fifo = dir + "/train-00000.bin";
  ASSERT_EQ(0, ::mkfifo(fifo.c_str(), 0600));
  const std::string msg = error_of([&] { DataLoader loader(counting_config(fifo, 8, 1, 0.0)); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST(DataLoader, ResolvesGlobsDirectoriesAndFiles) {
  const std::string dir = test::temp_dir("loader_paths");
  write_shard(dir + "/train-00001.bin", counting_shard(10, 0, 10));
  write_shard(dir + "/train-00000.bin", counting_shard(10, 0, 10));
  write_text(dir + "/meta.json", "{}");
  const auto from_dir = resolve_shard_paths({dir});
  ASSERT_EQ(from_dir.size(), 2u);
  EXPECT_EQ(fs::path(from_dir[0]).filename(), "train-00000.bin");
  EXPECT_EQ(resolve_shard_paths({dir + "/train-*.bin"}), from_dir);
  EXPECT_EQ(resolve_shard_paths({dir + "/train-00001.bin"}).size(), 1u);
  std::string msg = error_of([&] { resolve_shard_paths({dir + "/val-*.bin"}); });
  EXPECT_NE(msg.find("val-*.bin"), std::string::npos) << msg;
  msg = error_of([&] { resolve_shard_paths({dir + "/nope.bin"}); });
  EXPECT_NE(msg.find("nope.bin"), std::string::npos) << msg;
  // A shard reached twice would be trained twice, and validation would hold training text.
  msg = error_of([&] { resolve_shard_paths({dir, dir + "/./train-00001.bin"}); });
  EXPECT_NE(msg.find("data: shard " + dir + "/./train-00001.bin is listed twice in train_data (also as " + dir +
                     "/train-00001.bin)"), std::string::npos) << msg;
  msg = error_of([&] { resolve_shard_paths({dir + "/train-00000.bin", dir + "/train-00000.bin"}); });
  EXPECT_NE(msg.find("is listed twice in train_data; each shard"), std::string::npos) << msg;
  // A *.bin that is no file, in a directory or matched by a glob, is named: it was passed over and
  // the run trained on the rest (a fuzzing review, 2026-12-02). So is a dangling link given itself.
  fs::create_symlink(dir + "/gone.bin", dir + "/train-00002.bin");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("data: directory " + dir + " holds " + dir + "/train-00002.bin, which is a symbolic link to " + dir +
                     "/gone.bin, which does not exist, not a shard file"), std::string::npos) << msg;
  msg = error_of([&] { resolve_shard_paths({dir + "/train-*.bin"}); });
  EXPECT_NE(msg.find("data: " + dir + "/train-*.bin matches " + dir + "/train-00002.bin is a symbolic link to"),
            std::string::npos) << msg;
  msg = error_of([&] { resolve_shard_paths({dir + "/train-00002.bin"}); });
  EXPECT_NE(msg.find("data: shard path " + dir + "/train-00002.bin is a symbolic link to " + dir + "/gone.bin, which does "
                     "not exist"), std::string::npos) << msg;
  fs::remove(dir + "/train-00002.bin");
  fs::create_symlink("train-00002.bin", dir + "/train-00002.bin");  // itself
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("train-00002.bin, which is a symbolic link loop"), std::string::npos) << msg;
  fs::remove(dir + "/train-00002.bin");
  fs::create_directories(dir + "/train-00002.bin");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("train-00002.bin, which is a directory, not a shard file"), std::string::npos) << msg;
  fs::remove(dir + "/train-00002.bin");
  fs::create_directories(dir + "/train-folder");  // matched, but no *.bin: passed over
  EXPECT_EQ(resolve_shard_paths({dir + "/train-*"}), from_dir);
  // So are the files prepare writes beside its shards: `data/*` took meta.json for a shard.
  write_text(dir + "/tokenizer.json", "{}");
  EXPECT_EQ(resolve_shard_paths({dir + "/*"}), from_dir);
  // Any other file is read as a shard (shards may be named otherwise) and its header checked.
  write_text(dir + "/notes.txt", "not a shard");
  EXPECT_EQ(resolve_shard_paths({dir + "/*"}).size(), 3u);
}

// A directory's meta.json from `ingot prepare` lists its shards: a missing shard, one of another
// length and a .bin it does not list are errors naming the file (they trained on other data
// without a word). A meta.json that is not prepare's is not read.
TEST(DataLoader, ShardsMustMatchTheirMetaJson) {
  const std::string dir = test::temp_dir("loader_meta");
  write_shard(dir + "/train-00000.bin", counting_shard(10, 0, 10));
  write_shard(dir + "/train-00001.bin", counting_shard(12, 0, 10));
  const std::string meta = R"({"format": "ingot-token-shards", "shards": [
      {"file": "train-00000.bin", "num_tokens": 10, "num_documents": 1},
      {"file": "train-00001.bin", "num_tokens": 12, "num_documents": 1}]})";
  write_text(dir + "/meta.json", meta);
  EXPECT_EQ(resolve_shard_paths({dir}).size(), 2u);

  // The directory's shards come in the order meta.json lists them, which is the order prepare wrote
  // them: sorted as names, a 100,000th shard (train-100000.bin) came between train-10000 and
  // train-10001.
  fs::rename(dir + "/train-00000.bin", dir + "/train-2.bin");
  fs::rename(dir + "/train-00001.bin", dir + "/train-10.bin");
  std::string renamed = meta;
  renamed.replace(renamed.find("train-00000.bin"), 15, "train-2.bin");
  renamed.replace(renamed.find("train-00001.bin"), 15, "train-10.bin");
  write_text(dir + "/meta.json", renamed);
  EXPECT_EQ(resolve_shard_paths({dir}), (std::vector<std::string>{dir + "/train-2.bin", dir + "/train-10.bin"}));
  fs::rename(dir + "/train-2.bin", dir + "/train-00000.bin");
  fs::rename(dir + "/train-10.bin", dir + "/train-00001.bin");
  // A count that is no whole number is named as such (it was "lacks \"file\" or \"num_tokens\""),
  // and so is a shard listed twice.
  write_text(dir + "/meta.json", std::string(meta).replace(meta.find("12,"), 2, "12.0"));
  std::string msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find(dir + "/meta.json: the \"num_tokens\" of shard train-00001.bin is not a whole number: 12.0"),
            std::string::npos) << msg;
  write_text(dir + "/meta.json", std::string(meta).replace(meta.find("train-00001.bin"), 15, "train-00000.bin"));
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find(dir + "/meta.json lists shard train-00000.bin twice"), std::string::npos) << msg;

  // A count written past int64 was named as -1.
  write_text(dir + "/meta.json", std::string(meta).replace(meta.find("12,"), 2, "18446744073709551615"));
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("holds 12 tokens, but " + dir + "/meta.json lists 18446744073709551615"), std::string::npos) << msg;
  write_text(dir + "/meta.json", meta);
  write_shard(dir + "/train-00001.bin", counting_shard(11, 0, 10));
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("data: shard " + dir + "/train-00001.bin holds 11 tokens, but " + dir + "/meta.json lists 12"),
            std::string::npos) << msg;
  fs::remove(dir + "/train-00001.bin");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find(dir + "/meta.json lists shard train-00001.bin, which is missing from " + dir), std::string::npos) << msg;
  // With every shard gone, the first listed one is named (it said only "holds no *.bin shards").
  fs::rename(dir + "/train-00000.bin", dir + "/train-00000.moved");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find(dir + "/meta.json lists shard train-00000.bin, which is missing from " + dir), std::string::npos) << msg;
  fs::rename(dir + "/train-00000.moved", dir + "/train-00000.bin");
  write_shard(dir + "/train-00001.bin", counting_shard(12, 0, 10));
  write_shard(dir + "/extra.bin", counting_shard(10, 0, 10));
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("data: " + dir + "/extra.bin is not one of the shards " + dir + "/meta.json lists"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("delete meta.json to train on the directory's shards as they are"), std::string::npos) << msg;
  // A glob or a file names the shards itself: meta.json is not consulted.
  EXPECT_EQ(resolve_shard_paths({dir + "/*.bin"}).size(), 3u);
  write_text(dir + "/meta.json", R"({"note": "someone else's"})");
  EXPECT_EQ(resolve_shard_paths({dir}).size(), 3u);
  write_text(dir + "/meta.json", "{\"format\": \"ingot-token-shards\", \"shards\": [");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find(dir + "/meta.json"), std::string::npos) << msg;
  // A prepare --overwrite killed mid-swap: whatever meta.json says, the shards may be mixed.
  fs::remove(dir + "/meta.json");
  write_text(dir + "/.prepare-12345/old/train-00000.bin", "a shard set aside");
  msg = error_of([&] { resolve_shard_paths({dir}); });
  EXPECT_NE(msg.find("data: " + dir + " holds " + dir + "/.prepare-12345/old, a dataset that an `ingot prepare --overwrite`"),
            std::string::npos) << msg;
}

// ---------------------------------------------------------------- tokenizer

TEST(DataByteTokenizer, RoundTripsAnyBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eos_id(), 256);
  EXPECT_EQ(tok.name(), "byte");
  const std::string text("h\xc3\xa9\xff\x00z", 6);  // includes invalid UTF-8 and a NUL
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{104, 0xc3, 0xa9, 0xff, 0, 122}));
  EXPECT_EQ(tok.decode(ids), text);
  const std::vector<int32_t> with_eos = {104, 105, 256};
  EXPECT_EQ(tok.decode(with_eos), "hi<|endoftext|>");
  const std::vector<int32_t> bad = {1, 257};
  const std::string msg = error_of([&] { tok.decode(bad); });
  EXPECT_NE(msg.find("257"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- prepare

TEST(DataPrepare, TextFilesOneDocumentEach) {
  const std::string dir = test::temp_dir("prepare_text");
  write_text(dir + "/in/b.txt", "world\n");
  write_text(dir + "/in/a.txt", "hello");
  write_text(dir + "/in/sub/c.txt", "\xff\xfe raw");  // invalid UTF-8 is just bytes
  write_text(dir + "/in/empty.txt", "");
  write_text(dir + "/in/.hidden", "ignored");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.output_dir = dir + "/out";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_files, 3);
  EXPECT_EQ(r.empty_files, 1);  // found in a directory: skipped and counted
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_EQ(r.num_tokens, (5 + 1) + (6 + 1) + (6 + 1));
  ASSERT_EQ(r.shards.size(), 1u);
  Shard s(dir + "/out/train-00000.bin");
  EXPECT_EQ(s.vocab_size(), 257u);
  EXPECT_EQ(s.token_width(), 2u);
  EXPECT_FALSE(s.has_loss_mask());
  // Sorted by path: a.txt, b.txt, sub/c.txt.
  EXPECT_EQ(std::vector<uint64_t>(s.document_starts().begin(), s.document_starts().end()),
            (std::vector<uint64_t>{0, 6, 13}));
  EXPECT_EQ(tok.decode(shard_tokens(s)), "hello<|endoftext|>world\n<|endoftext|>\xff\xfe raw<|endoftext|>");

  const auto meta = nlohmann::json::parse(test::read_file(dir + "/out/meta.json"));
  EXPECT_EQ(meta.at("tokenizer"), "byte");
  EXPECT_EQ(meta.at("vocab_size"), 257);
  EXPECT_EQ(meta.at("num_tokens"), 20);
  EXPECT_EQ(meta.at("num_documents"), 3);
  EXPECT_EQ(meta.at("shards").at(0).at("file"), "train-00000.bin");
  EXPECT_FALSE(fs::exists(dir + "/out/meta.json.tmp"));

  // A second run into the same directory needs overwrite.
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("already holds"), std::string::npos) << msg;
  o.overwrite = true;
  EXPECT_EQ(prepare_dataset(o, tok).num_tokens, 20);

  // Only prepare's own files are a dataset's: a folder under a shard's name, a .bin file under
  // another name (training would read it) and a meta.json of another kind are the user's, and
  // refused by name, --overwrite or not. --overwrite deleted them (a folder with what it held).
  const std::string before = test::read_file(dir + "/out/meta.json");
  fs::create_directories(dir + "/out/train-00009.bin/notes");
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); })
                .find("prepare: output directory " + dir + "/out holds train-00009.bin, which is not a file, under a "
                      "name the dataset's files take; move it"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(dir + "/out/train-00009.bin/notes"));
  fs::remove_all(dir + "/out/train-00009.bin");
  write_text(dir + "/out/weights.bin", "the user's");
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); })
                .find("holds weights.bin, which is no shard of a prepared dataset, but which training on the folder "
                      "would read as one"),
            std::string::npos);
  EXPECT_EQ(test::read_file(dir + "/out/weights.bin"), "the user's");
  fs::remove(dir + "/out/weights.bin");
  write_text(dir + "/other/meta.json", "{\"mine\": 1}");
  write_text(dir + "/other/notes.txt", "kept");
  o.output_dir = dir + "/other";
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); }).find("holds a meta.json that no `ingot prepare` wrote"),
            std::string::npos);
  EXPECT_EQ(test::read_file(dir + "/other/meta.json"), "{\"mine\": 1}");
  o.output_dir = dir + "/out";
  EXPECT_EQ(test::read_file(dir + "/out/meta.json"), before);
  // Overwriting sets the old dataset aside before the new one moves in (it used to delete the old
  // files first, and a failure midway lost both), and keeps what is not the dataset's.
  fs::create_directories(dir + "/out/shards-backup.bin/notes");  // a folder: training skips it
  write_text(dir + "/out/notes.txt", "kept");
  EXPECT_EQ(prepare_dataset(o, tok).num_tokens, 20);
  EXPECT_TRUE(fs::is_regular_file(dir + "/out/meta.json"));
  EXPECT_EQ(Shard(dir + "/out/train-00000.bin").num_tokens(), 20u);
  EXPECT_TRUE(fs::exists(dir + "/out/shards-backup.bin/notes"));
  EXPECT_EQ(test::read_file(dir + "/out/notes.txt"), "kept");
  for (const auto& entry : fs::directory_iterator(dir + "/out"))  // no staging folder left
    EXPECT_EQ(entry.path().filename().string().rfind(".prepare-", 0), std::string::npos) << entry.path();
}

// Invalid UTF-8 in a plain-text file is named by its file line and column: the message said "FILE:3:
// ... at byte 19 of the input text", the line where the document starts and a byte counted from
// there, which read as a file offset (and, without a separator, no line at all).
TEST(DataPrepare, InvalidUtf8IsNamedByFileLineAndColumn) {
  const std::string dir = test::temp_dir("prepare_invalid_utf8");
  BpeTokenizer tok =
      BpeTokenizer::from_file(test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json");
  write_text(dir + "/sep.txt", "first doc\n%\nline one\nline two \xff here\n%\nok\n");
  write_text(dir + "/whole.txt", "abc\ndef\xfe\n");
  PrepareOptions o;
  o.output_dir = dir + "/out";
  o.inputs = {dir + "/sep.txt"};
  o.doc_separator = "%";
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: " + dir + "/sep.txt:4: invalid UTF-8 (byte 0xFF) at column 10: a tokenizer.json "
                     "tokenizer reads UTF-8 text"), std::string::npos) << msg;
  o.inputs = {dir + "/whole.txt"};
  o.doc_separator.clear();
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: " + dir + "/whole.txt:2: invalid UTF-8 (byte 0xFE) at column 4"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

TEST(DataPrepare, FortuneSeparatorSplitsDocuments) {
  const std::string dir = test::temp_dir("prepare_fortune");
  write_text(dir + "/in/fortunes", "one\ntwo\n%\nthree\n%\r\n%\nfour");
  write_text(dir + "/in/fortunes.dat", std::string("\0\0\0\2binary", 10));
  fs::create_symlink("fortunes", dir + "/in/fortunes.u8");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_files, 1);
  EXPECT_EQ(r.skipped_binary_files, 1);
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_EQ(r.num_tokens, (8 + 1) + (6 + 1) + (4 + 1));
  Shard s(dir + "/out/train-00000.bin");
  EXPECT_EQ(std::vector<uint64_t>(s.document_starts().begin(), s.document_starts().end()),
            (std::vector<uint64_t>{0, 9, 16}));
  EXPECT_EQ(tok.decode(shard_tokens(s)), "one\ntwo\n<|endoftext|>three\n<|endoftext|>four<|endoftext|>");
}

// Lines end at "\n", "\r\n" or a lone "\r" (old Mac files). Split at "\n" alone, a CR-only file's
// separators never matched (its documents merged, the separators trained on), and a CR-only JSON
// Lines file was one invalid line (`--skip-invalid-json` dropped all its records as one).
TEST(DataPrepare, CarriageReturnsEndLines) {
  const std::string dir = test::temp_dir("prepare_cr_lines");
  write_text(dir + "/cr.txt", "a1\rb1\r%\ra2\r%\r");
  write_text(dir + "/mixed.txt", "b1\r\n%\ra2\n%\nc\r");
  write_text(dir + "/cr.jsonl", "{\"text\": \"r1\"}\r{\"text\": \"r2\"}\r\r{\"text\": \"r3\"}");
  write_text(dir + "/bom.jsonl", "\xEF\xBB\xBF\r\n{\"text\": \"r4\"}\r\n");  // a BOM on a blank first line
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/cr.txt", dir + "/mixed.txt", dir + "/cr.jsonl", dir + "/bom.jsonl"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 9);
  EXPECT_EQ(r.skipped_json_lines, 0);
  EXPECT_EQ(tok.decode(shard_tokens(Shard(dir + "/out/train-00000.bin"))),
            "a1\rb1\r<|endoftext|>a2\r<|endoftext|>b1\r\n<|endoftext|>a2\n<|endoftext|>c\r<|endoftext|>"
            "r1<|endoftext|>r2<|endoftext|>r3<|endoftext|>r4<|endoftext|>");

  // Records and invalid UTF-8 are placed by the same lines.
  write_text(dir + "/bad.jsonl", "{\"text\": \"ok\"}\r{\"text\": 1}\r");
  o.inputs = {dir + "/bad.jsonl"};
  o.doc_separator.clear();
  o.overwrite = true;
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: " + dir + "/bad.jsonl:2: no string field \"text\""), std::string::npos) << msg;
  BpeTokenizer bpe =
      BpeTokenizer::from_file(test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json");
  write_text(dir + "/bad.txt", "one\rtwo\r\nthree \xff\r");
  o.inputs = {dir + "/bad.txt"};
  msg = error_of([&] { prepare_dataset(o, bpe); });
  EXPECT_NE(msg.find("prepare: " + dir + "/bad.txt:3: invalid UTF-8 (byte 0xFF) at column 7"), std::string::npos) << msg;
}

// Folders are walked through links to folders (each real folder once, so a loop ends, and never a
// folder that holds the input); a broken link is an error naming it. Both were passed over, and
// the dataset lost their files without a word.
TEST(DataPrepare, DirectoryWalkFollowsFolderLinks) {
  const std::string dir = test::temp_dir("prepare_walk_links");
  write_text(dir + "/tree/a/x.txt", "A");
  write_text(dir + "/ext/deep/e.txt", "E");
  write_text(dir + "/ext/f.txt", "F");
  fs::create_symlink("../ext", dir + "/tree/linkdir");
  fs::create_symlink("../../tree", dir + "/tree/a/loop");  // back to the top
  fs::create_symlink("..", dir + "/tree/up");              // the input's parent: ext, out, ... not read
  fs::create_symlink("../ext/f.txt", dir + "/tree/linkfile");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/tree"};
  o.output_dir = dir + "/out";
  PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_files, 3);  // x.txt; deep/e.txt and f.txt through linkdir; linkfile is f.txt again
  EXPECT_EQ(tok.decode(shard_tokens(Shard(dir + "/out/train-00000.bin"))), "A<|endoftext|>E<|endoftext|>F<|endoftext|>");

  o.overwrite = true;
  fs::create_symlink("nowhere", dir + "/tree/a/dangling");
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: " + dir + "/tree/a/dangling is a symbolic link to nowhere, which does not exist"),
            std::string::npos) << msg;
}

// A folder that cannot be listed, and one that can be listed but whose entries cannot be looked at
// (read but no search permission, as `chmod -R a-x` leaves), are errors naming them: both were
// passed over with exit 0. As root (CI), each check runs in a child that has become nobody, for
// whom the folder (all may enter and write it) and the output folder are open as for their owner.
TEST(DataPrepare, DirectoryWalkNamesFoldersItCannotRead) {
  const std::string dir = test::temp_dir("prepare_walk_unreadable");
  write_text(dir + "/tree/top.txt", "T");
  write_text(dir + "/tree/sub/s.txt", "S");
  fs::create_directories(dir + "/tree/secret");
  for (const std::string& open_to_all : {dir, dir + "/tree", dir + "/tree/sub"})
    fs::permissions(open_to_all, fs::perms::all);
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/tree"};
  o.output_dir = dir + "/out";
  o.num_threads = 1;  // the check may run in a forked child: no thread pool the parent started
  std::string why;
  fs::permissions(dir + "/tree/secret", fs::perms::none);
  std::string msg = test::error_with_permissions_binding([&] { prepare_dataset(o, tok); }, dir + "/tree", &why);
  fs::permissions(dir + "/tree/secret", fs::perms::all);
  if (!why.empty()) GTEST_SKIP() << why;
  EXPECT_NE(msg.find("prepare: cannot list folder " + dir + "/tree/secret: Permission denied"), std::string::npos) << msg;
  fs::permissions(dir + "/tree/sub", fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  msg = test::error_with_permissions_binding([&] { prepare_dataset(o, tok); }, dir + "/tree", &why);
  fs::permissions(dir + "/tree/sub", fs::perms::all);
  if (!why.empty()) GTEST_SKIP() << why;
  EXPECT_NE(msg.find("prepare: cannot look at " + dir + "/tree/sub/s.txt: Permission denied"), std::string::npos) << msg;
}

// The report warns when the shards come near the memory maps a process may hold: training maps
// every shard, and a dataset past vm.max_map_count could not be opened ("mmap failed: Cannot
// allocate memory", with gigabytes free).
TEST(DataPrepare, ReportWarnsOfShardsNearTheMapLimit) {
  const int64_t maps = max_memory_maps();
  if (maps <= 0) GTEST_SKIP() << "no /proc/sys/vm/max_map_count here";
  PrepareReport r;
  r.shards.resize(size_t(maps / 2));
  EXPECT_EQ(r.to_string().find("warning"), std::string::npos);
  r.shards.resize(size_t(maps / 2 + 1));
  EXPECT_NE(r.to_string().find("prepare: warning: " + std::to_string(maps / 2 + 1) + " shards; training maps each one"),
            std::string::npos) << r.to_string();
}

// A separator with a line break could never match (lines are compared one at a time), one given
// only JSON Lines inputs was ignored, and a byte-order mark hid a separator on the first line and
// started the first document.
TEST(DataPrepare, DocSeparatorChecksAndByteOrderMark) {
  const std::string dir = test::temp_dir("prepare_separator_checks");
  write_text(dir + "/bom.txt", "\xEF\xBB\xBF%\nA\n%\nB\n");
  write_text(dir + "/d.jsonl", "{\"text\": \"x\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/bom.txt"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%\n%";
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); }).find("--doc-separator \"%\n%\" holds a line break"),
            std::string::npos);
  o.doc_separator = "%";
  o.inputs = {dir + "/d.jsonl"};
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); })
                .find("--doc-separator applies to plain-text inputs, and every input is JSON Lines (" + dir + "/d.jsonl)"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/out"));
  o.inputs = {dir + "/bom.txt", dir + "/d.jsonl"};  // one plain-text input is enough
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 3);
  Shard s(dir + "/out/train-00000.bin");
  EXPECT_EQ(tok.decode(shard_tokens(s)), "A\n<|endoftext|>B\n<|endoftext|>x<|endoftext|>");
}

// A dataset that a killed prepare --overwrite had set aside (.prepare-<pid>/old) stops training on
// the folder ("may mix two datasets"). A later --overwrite replaces the folder's dataset: the one
// set aside is then kept as superseded/, which stops nothing. It used to stay old/, and training
// stayed refused after the re-run.
TEST(DataPrepare, AnOverwriteSupersedesADatasetAKilledPrepareSetAside) {
  const std::string dir = test::temp_dir("prepare_set_aside");
  ByteTokenizer tok;
  PrepareOptions o = one_file_into_out(dir, "some text");
  prepare_dataset(o, tok);
  const std::string pid = ended_process_id();
  ASSERT_FALSE(pid.empty());
  const std::string aside = dir + "/out/.prepare-" + pid;
  write_text(aside + "/old/train-00000.bin", "a shard set aside");
  EXPECT_NE(error_of([&] { resolve_shard_paths({dir + "/out"}); }).find("holds " + aside + "/old"), std::string::npos);
  std::ostringstream log;
  o.log = &log;
  o.overwrite = true;
  prepare_dataset(o, tok);
  EXPECT_NE(log.str().find("note: " + aside + "/superseded holds the dataset a killed `ingot prepare --overwrite` had "
                           "set aside, which this prepare's dataset replaces; it is kept"),
            std::string::npos) << log.str();
  EXPECT_EQ(test::read_file(aside + "/superseded/train-00000.bin"), "a shard set aside");
  EXPECT_EQ(resolve_shard_paths({dir + "/out"}).size(), 1u);
  prepare_dataset(o, tok);  // kept by the next prepare too
  EXPECT_TRUE(fs::exists(aside + "/superseded/train-00000.bin"));
}

// An empty old/ (a prepare killed before it set any file aside; versions before 2026-12-02 made
// old/ first) holds no dataset: training reads the folder, and the next prepare removes the killed
// prepare's folder as a partial output. It used to stop every run on the folder, like a dataset set aside.
TEST(DataPrepare, AnEmptySetAsideFolderStopsNothing) {
  const std::string dir = test::temp_dir("prepare_empty_old");
  ByteTokenizer tok;
  PrepareOptions o = one_file_into_out(dir, "some text");
  prepare_dataset(o, tok);
  const std::string pid = ended_process_id();
  ASSERT_FALSE(pid.empty());
  const std::string killed = dir + "/out/.prepare-" + pid;
  fs::create_directories(killed + "/old");
  EXPECT_FALSE(holds_set_aside_dataset(killed));
  EXPECT_EQ(resolve_shard_paths({dir + "/out"}).size(), 1u);
  write_text(killed + "/old/meta.json", "a dataset set aside");
  EXPECT_TRUE(holds_set_aside_dataset(killed));
  EXPECT_NE(error_of([&] { resolve_shard_paths({dir + "/out"}); }).find("holds " + killed + "/old"), std::string::npos);
  fs::remove(killed + "/old/meta.json");
  std::ostringstream log;
  o.log = &log;
  o.overwrite = true;
  prepare_dataset(o, tok);
  EXPECT_FALSE(fs::exists(killed)) << log.str();
  EXPECT_NE(log.str().find("note: removed " + killed + ", the partial output of a killed prepare"), std::string::npos)
      << log.str();
}

// Counts of one take the singular ("1 shard", "1 shard file"); they read "1 shard(s)".
TEST(DataPrepare, CountsOfOneTakeTheSingular) {
  const std::string dir = test::temp_dir("prepare_singular");
  ByteTokenizer tok;
  const std::string report = prepare_dataset(one_file_into_out(dir, std::string(300, 'a')), tok).to_string();
  EXPECT_NE(report.find("prepare: 1 document, 301 tokens from 1 file into 1 shard in "), std::string::npos) << report;
  DataLoaderConfig c;
  c.paths = {dir + "/out"};
  c.seq_len = 16;
  c.vocab_size = tok.vocab_size();
  const std::string summary = DataLoader(c).summary();
  EXPECT_EQ(summary.rfind("data: 1 shard file, 301 tokens; ", 0), 0u) << summary;
}

// A prepare killed while moving its dataset in (shards first, meta.json last) left part of it in
// the output directory and the rest, with meta.json, in its folder; versions before 2026-12-02 also
// left an empty old/ there. Training on the part is refused, naming the meta.json left behind; the
// next prepare keeps the folder (so that the refusal stands) unless it completes, and then removes it.
TEST(DataPrepare, APrepareKilledWhileMovingItsDatasetInStopsTraining) {
  const std::string dir = test::temp_dir("prepare_killed_move_in");
  ByteTokenizer tok;
  PrepareOptions o = one_file_into_out(dir, std::string(300, 'a'));
  o.output_dir = dir + "/staged";
  o.shard_tokens = 100;
  ASSERT_GE(prepare_dataset(o, tok).shards.size(), 2u);
  const std::string pid = ended_process_id();
  ASSERT_FALSE(pid.empty());
  const std::string out = dir + "/out", killed = out + "/.prepare-" + pid;
  fs::create_directories(killed + "/old");
  fs::copy_file(dir + "/staged/train-00000.bin", out + "/train-00000.bin");
  for (const char* rest : {"train-00001.bin", "meta.json"}) fs::copy_file(dir + "/staged/" + rest, killed + "/" + rest);
  EXPECT_TRUE(holds_staged_dataset(killed));
  EXPECT_FALSE(holds_set_aside_dataset(killed));
  EXPECT_NE(error_of([&] { resolve_shard_paths({out}); }).find("holds " + killed + "/meta.json, the rest of a dataset"),
            std::string::npos) << error_of([&] { resolve_shard_paths({out}); });
  std::ostringstream log;
  o.log = &log;
  o.output_dir = out;
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); }).find("already holds train-00000.bin"), std::string::npos);
  EXPECT_TRUE(fs::exists(killed + "/meta.json")) << "kept while the output is still partial";
  EXPECT_NE(log.str().find("note: " + killed + " holds the rest of a dataset"), std::string::npos) << log.str();
  o.overwrite = true;
  prepare_dataset(o, tok);
  EXPECT_FALSE(fs::exists(killed)) << log.str();
  EXPECT_EQ(resolve_shard_paths({out}).size(), resolve_shard_paths({dir + "/staged"}).size());
}

// An input that cannot be read says why, as the file system does: a name too long was "not a file
// or directory".
TEST(DataPrepare, MissingInputsSayWhy) {
  const std::string dir = test::temp_dir("prepare_missing_inputs");
  ByteTokenizer tok;
  PrepareOptions o;
  o.output_dir = dir + "/out";
  o.inputs = {dir + "/nope.txt"};
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); }).find("prepare: input " + dir + "/nope.txt: No such file or directory"),
            std::string::npos);
  o.inputs = {dir + "/" + std::string(256, 'y')};
  EXPECT_NE(error_of([&] { prepare_dataset(o, tok); }).find(std::string(256, 'y') + ": File name too long"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

TEST(DataPrepare, JsonlTextFieldAndShardSplitting) {
  const std::string dir = test::temp_dir("prepare_jsonl");
  write_text(dir + "/data.jsonl",
             "{\"text\": \"abc\"}\n\n{\"text\": \"defgh\", \"id\": 2}\n{\"text\": \"\"}\n"
             "{\"text\": \"0123456789abcdef\"}\n{\"text\": \"xy\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/data.jsonl"};
  o.output_dir = dir + "/out";
  o.shard_tokens = 8;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 4);
  EXPECT_EQ(r.num_tokens, 4 + 6 + 17 + 3);
  // [abc.] [defgh.] then the 17-token document fills two whole shards and one token more, and xy
  // follows it: shards of 4, 6, 8, 8, 1+3 tokens.
  std::vector<int64_t> sizes;
  for (const auto& s : r.shards) sizes.push_back(s.num_tokens);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 6, 8, 8, 4}));
  Shard last(dir + "/out/train-00004.bin");
  EXPECT_EQ(std::vector<uint64_t>(last.document_starts().begin(), last.document_starts().end()),
            (std::vector<uint64_t>{0, 1}));
  // The loader reads the whole directory back as one stream.
  DataLoaderConfig c;
  c.paths = {dir + "/out"};
  c.seq_len = 4;
  c.vocab_size = 257;
  c.val_fraction = 0;
  DataLoader loader(c);
  EXPECT_EQ(loader.num_tokens(), 30);
}

// Two prepares into one folder: the one that finishes second finds the first one's dataset at its
// commit and leaves it (it replaced it, and both said they had written theirs). The second prepare
// here starts from inside the first, at its first "wrote" line, through its log stream.
TEST(DataPrepare, APrepareThatFinishedMeanwhileIsNotReplaced) {
  const std::string dir = test::temp_dir("prepare_race");
  write_text(dir + "/first.txt", "first dataset");
  write_text(dir + "/second.txt", "the second, longer dataset");
  ByteTokenizer tok;
  PrepareOptions first;
  first.inputs = {dir + "/first.txt"};
  first.output_dir = dir + "/out";
  struct OnFirstWrite : std::streambuf {
    std::string text;
    std::function<void()> run;
    std::streamsize xsputn(const char* s, std::streamsize n) override {
      text.append(s, size_t(n));
      if (run && text.find("prepare: wrote") != std::string::npos) std::exchange(run, nullptr)();
      return n;
    }
    int overflow(int c) override {
      const char ch = char(c);
      return c == traits_type::eof() ? 0 : (xsputn(&ch, 1), c);
    }
  } buffer;
  std::ostream log(&buffer);
  PrepareOptions second = first;
  second.inputs = {dir + "/second.txt"};
  second.log = &log;
  buffer.run = [&] { prepare_dataset(first, tok); };
  const std::string msg = test::error_of([&] { prepare_dataset(second, tok); });
  EXPECT_NE(msg.find("output directory " + dir + "/out now holds a dataset (meta.json) that another process wrote"),
            std::string::npos) << msg;
  Shard kept(dir + "/out/train-00000.bin");
  EXPECT_EQ(kept.num_tokens(), int64_t(std::string("first dataset").size()) + 1);
  for (const auto& entry : fs::directory_iterator(dir + "/out"))
    EXPECT_EQ(entry.path().filename().string().find(".prepare-"), std::string::npos) << entry.path();
}

// A truncated text document keeps its end-of-text token: in stream mode it is the only mark
// between documents (it used to be cut off with the tail). Whitespace-only JSONL texts are dropped,
// as whitespace-only text files are.
TEST(DataPrepare, TruncatedTextKeepsItsEndOfTextToken) {
  const std::string dir = test::temp_dir("prepare_truncate");
  // "abc" with its end-of-text token is exactly max_seq_len: kept whole, not counted as truncated.
  write_text(dir + "/data.jsonl",
             "{\"text\": \"abcdefgh\"}\n{\"text\": \" \\n\\t \"}\n{\"text\": \"xy\"}\n{\"text\": \"pqr\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/data.jsonl"};
  o.output_dir = dir + "/out";
  o.max_seq_len = 4;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_EQ(r.truncated, 1);
  Shard s(dir + "/out/train-00000.bin");
  EXPECT_EQ(tok.decode(shard_tokens(s)), "abc<|endoftext|>xy<|endoftext|>pqr<|endoftext|>");
}

// An earlier dataset inside an input directory adds nothing: not its shards, its meta.json, or the
// tokenizer files the CLI copies beside them (4M tokens of JSON from a one-line corpus before).
TEST(DataPrepare, EarlierDatasetInTheInputIsSkipped) {
  const std::string dir = test::temp_dir("prepare_nested");
  write_text(dir + "/in/a.txt", "hello");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.output_dir = dir + "/in/old";
  prepare_dataset(o, tok);
  write_text(dir + "/in/old/tokenizer.json", "{\"model\": {}}");
  write_text(dir + "/in/old/tokenizer_config.json", "{\"eos_token\": null}");
  o.output_dir = dir + "/new";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 1);
  EXPECT_EQ(r.num_tokens, 6);
}

// A file named on the command line was read whatever it held: a shard (even the dataset an
// --overwrite replaced, whose tokens were then lost) became a dataset of its bytes. Now it is
// refused by name, and the old dataset stays as it was. Other binary files named there are read,
// as the byte tokenizer keeps every byte.
TEST(DataPrepare, NamedShardsAreRefused) {
  const std::string dir = test::temp_dir("prepare_named_binary");
  write_text(dir + "/a.txt", "hello");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output_dir = dir + "/data";
  prepare_dataset(o, tok);
  const std::string shard = dir + "/data/train-00000.bin";
  const std::string before = test::read_file(shard);
  o.inputs = {shard};
  o.overwrite = true;
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: input " + shard + " is an Ingot token shard (it starts with \"INGOTTOK\"), not text"),
            std::string::npos) << msg;
  EXPECT_EQ(test::read_file(shard), before);
  o.output_dir = dir + "/other";
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("is an Ingot token shard"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir + "/other"));
  // Text that starts with the magic is not a shard: the version and width that follow are binary.
  write_text(dir + "/team.txt", "INGOTTOK is the name of our team.");
  o.inputs = {dir + "/team.txt"};
  EXPECT_EQ(prepare_dataset(o, tok).num_tokens, 33 + 1);
  // A text file of the dataset being replaced (its meta.json, named as text) is refused too: it
  // would be read, then replaced by what it became.
  o.inputs = {dir + "/data/meta.json"};
  o.output_dir = dir + "/data";
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: input " + dir + "/data/meta.json is a file of the dataset in " + dir +
                     "/data that this prepare would replace (--overwrite)"), std::string::npos) << msg;
  EXPECT_EQ(test::read_file(shard), before);
  // The file system's root, as `ingot train` refuses it for output_dir. (The input is empty, so a
  // prepare that passed the check would still fail before writing a shard there.)
  write_text(dir + "/empty.txt", "");
  o.inputs = {dir + "/empty.txt"};
  o.output_dir = "/";
  o.overwrite = false;
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: output directory / is the file system's root; give the dataset a folder of its own"),
            std::string::npos) << msg;
}

// A tokenizer file in the output directory that belongs to no dataset (a model's folder, say) is
// never replaced by a different one; the same file is fine (prepare into the tokenizer's folder).
TEST(DataPrepare, ForeignTokenizerFileInTheOutputIsKept) {
  const std::string dir = test::temp_dir("prepare_foreign_tokenizer");
  const std::string fixture = test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json";
  write_text(dir + "/a.txt", "hello there");
  BpeTokenizer tok = BpeTokenizer::from_file(fixture);
  PrepareOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output_dir = dir + "/out";
  o.tokenizer_file = fixture;
  o.overwrite = true;
  write_text(dir + "/out/tokenizer.json", "{\"mine\": true}");
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(dir + "/out holds a tokenizer.json that is not part of a dataset"), std::string::npos) << msg;
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer.json"), "{\"mine\": true}");
  EXPECT_FALSE(fs::exists(dir + "/out/meta.json"));

  write_text(dir + "/out/tokenizer.json", test::read_file(fixture));
  prepare_dataset(o, tok);
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer.json"), test::read_file(fixture));
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer_config.json"),
            test::read_file(test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer_config.json"));
  // meta.json lists what prepare wrote: the user's identical tokenizer.json is not the dataset's,
  // so a later --overwrite (here byte-level) replaces the dataset's files and keeps it.
  const auto meta = nlohmann::json::parse(test::read_file(dir + "/out/meta.json"));
  EXPECT_EQ(meta.at("tokenizer_files"), nlohmann::json::array({"tokenizer_config.json"})) << meta.dump();
  ByteTokenizer bytes;
  o.tokenizer_file.clear();
  prepare_dataset(o, bytes);
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer.json"), test::read_file(fixture));
  EXPECT_FALSE(fs::exists(dir + "/out/tokenizer_config.json"));

  // A meta.json that is not prepare's (a model folder's, say) is the user's: refused by name,
  // --overwrite or not, and kept with the folder's tokenizer.json. It used to be replaced.
  fs::create_directories(dir + "/model");
  write_text(dir + "/model/tokenizer.json", "{}");
  write_text(dir + "/model/meta.json", "{\"tokenizer\": \"meta-llama/Llama-3.2-1B\"}");
  o.output_dir = dir + "/model";
  EXPECT_NE(error_of([&] { prepare_dataset(o, bytes); }).find("holds a meta.json that no `ingot prepare` wrote"),
            std::string::npos);
  EXPECT_EQ(test::read_file(dir + "/model/tokenizer.json"), "{}");
  EXPECT_EQ(test::read_file(dir + "/model/meta.json"), "{\"tokenizer\": \"meta-llama/Llama-3.2-1B\"}");
}

// Chat data carries the tokenizer_config.json of the template that rendered it, not the one beside
// tokenizer.json: an export then ships the template the model was trained on.
TEST(DataPrepare, ChatDataCarriesTheTemplateThatRenderedIt) {
  const std::string dir = test::temp_dir("prepare_chat_template_carried");
  const std::string fixtures = test::source_dir() + "/tests/fixtures/chat";
  write_text(dir + "/c.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                               "{\"role\": \"assistant\", \"content\": \"hello\"}]}\n");
  BpeTokenizer tok = BpeTokenizer::from_file(fixtures + "/chatml_tokenizer/tokenizer.json");
  PrepareOptions o;
  o.format = PrepareFormat::chat;
  o.inputs = {dir + "/c.jsonl"};
  o.output_dir = dir + "/out";
  o.tokenizer_file = fixtures + "/chatml_tokenizer/tokenizer.json";
  o.chat_template = fixtures + "/chatml_default";
  prepare_dataset(o, tok);
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer_config.json"), test::read_file(fixtures + "/chatml_default/tokenizer_config.json"));
  EXPECT_EQ(test::read_file(dir + "/out/tokenizer.json"), test::read_file(o.tokenizer_file));
}

// Text documents get the tokenizer's special tokens as `tokenizers`' encode(text) adds them (Llama 3:
// <|begin_of_text|>, id 0 in the fixture), then the end-of-text token; meta.json records them.
TEST(DataPrepare, TextDocumentsGetTheTokenizersSpecialTokens) {
  const std::string dir = test::temp_dir("prepare_special_tokens");
  const std::string fixture = test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer";
  write_text(dir + "/a.txt", "hello world");
  BpeTokenizer tok = BpeTokenizer::from_file(fixture);
  PrepareOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output_dir = dir + "/with";
  prepare_dataset(o, tok);
  std::vector<int32_t> expected = {0};
  for (int32_t id : tok.encode("hello world")) expected.push_back(id);
  expected.push_back(tok.eos_id());
  Shard with(dir + "/with/train-00000.bin");
  std::vector<int32_t> tokens(with.num_tokens());
  with.read_tokens(0, with.num_tokens(), tokens.data());
  EXPECT_EQ(tokens, expected);
  const auto meta = nlohmann::json::parse(test::read_file(dir + "/with/meta.json"));
  EXPECT_EQ(meta.at("special_tokens").at("prefix"), nlohmann::json::array({0})) << meta.dump();

  o.output_dir = dir + "/without";
  o.add_special_tokens = false;
  prepare_dataset(o, tok);
  Shard without(dir + "/without/train-00000.bin");
  EXPECT_EQ(without.num_tokens(), with.num_tokens() - 1);

  // Truncation cuts the text and keeps the special tokens and the end-of-text token.
  o.add_special_tokens = true;
  o.max_seq_len = 3;
  o.output_dir = dir + "/cut";
  prepare_dataset(o, tok);
  Shard cut(dir + "/cut/train-00000.bin");
  std::vector<int32_t> cut_tokens(cut.num_tokens());
  cut.read_tokens(0, cut.num_tokens(), cut_tokens.data());
  EXPECT_EQ(cut_tokens, (std::vector<int32_t>{0, expected[1], tok.eos_id()}));

  // A template that ends the text with the end-of-text token itself: it is not added twice, and
  // survives truncation.
  nlohmann::json tokenizer = nlohmann::json::parse(test::read_file(fixture + "/tokenizer.json"));
  const std::string eos = tok.id_to_token(tok.eos_id());
  tokenizer["post_processor"]["single"].push_back({{"SpecialToken", {{"id", eos}, {"type_id", 0}}}});
  fs::create_directories(dir + "/tok");
  write_text(dir + "/tok/tokenizer.json", tokenizer.dump());
  fs::copy_file(fixture + "/tokenizer_config.json", dir + "/tok/tokenizer_config.json");
  BpeTokenizer ends_with_eos = BpeTokenizer::from_file(dir + "/tok");
  ASSERT_EQ(ends_with_eos.special_suffix(), std::vector<int32_t>{tok.eos_id()});
  o.output_dir = dir + "/eos_suffix";
  prepare_dataset(o, ends_with_eos);
  Shard eos_suffix(dir + "/eos_suffix/train-00000.bin");
  std::vector<int32_t> eos_tokens(eos_suffix.num_tokens());
  eos_suffix.read_tokens(0, eos_suffix.num_tokens(), eos_tokens.data());
  EXPECT_EQ(eos_tokens, (std::vector<int32_t>{0, expected[1], tok.eos_id()}));

  // A max_seq_len that leaves no room for text is refused (documents became [<|begin_of_text|>, eos]).
  o.max_seq_len = 2;
  o.output_dir = dir + "/no_room";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("max_seq_len 2 leaves no room for text: every document also takes 2 tokens"), std::string::npos) << msg;
}

// Documents of whitespace only carry no text: skipped, and counted in the report (they went
// without a word). Nothing between two separators is no document.
TEST(DataPrepare, BlankDocumentsAreSkippedAndCounted) {
  const std::string dir = test::temp_dir("prepare_blank");
  write_text(dir + "/in/a.txt", "one\n%\n \t\n%\n%\ntwo\n%\n");
  write_text(dir + "/in/b.txt", " \n\n");
  write_text(dir + "/in/c.jsonl", "{\"text\": \"three\"}\n{\"text\": \"  \"}\n{\"text\": \"\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_EQ(r.blank_documents, 4);  // a.txt's " \t\n", b.txt, c.jsonl's "  " and ""
  EXPECT_NE(r.to_string().find("prepare: skipped 4 blank documents (whitespace only)"), std::string::npos) << r.to_string();
  // Unicode's spaces are whitespace too (no-break, ideographic, line separator): such documents
  // were kept and trained on. A document with one other character, or with ill-formed UTF-8 (a lone
  // lead byte, a cut-off sequence, a continuation byte), is no blank one.
  write_text(dir + "/in/d.jsonl", "{\"text\": \"\\u00a0\\u3000 \\u2028\\n\"}\n{\"text\": \"\\u00a0x\\u3000\"}\n");
  write_text(dir + "/in/e.txt", "one\n%\n\xC2\xA0\xE3\x80\x80\t\n%\n \xE3\x80\n%\n\xA0 \n%\n\xC2\n");
  o.overwrite = true;
  const PrepareReport u = prepare_dataset(o, tok);
  EXPECT_EQ(u.num_documents, 3 + 1 + 4);  // d.jsonl's second record; e.txt's "one" and its three ill-formed ones
  EXPECT_EQ(u.blank_documents, 4 + 2);    // d.jsonl's first record, e.txt's second document
}

TEST(DataPrepare, MalformedJsonlNamesFileAndLine) {
  const std::string dir = test::temp_dir("prepare_bad_jsonl");
  const std::string file = dir + "/bad.jsonl";
  write_text(file,
             "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": broken\n{\"body\": \"x\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {file};
  o.output_dir = dir + "/out";
  o.shard_tokens = 3;  // a shard is already finished when the error comes
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(file + ":3"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/out"));  // no partial dataset, nor the directory it created, left behind

  o.skip_invalid_json = true;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.skipped_json_lines, 2);  // the broken line and the one without "text"
  EXPECT_EQ(r.num_documents, 2);

  o.skip_invalid_json = false;
  o.overwrite = true;
  o.text_field = "body";
  write_text(file, "{\"body\": \"x\"}\n{\"text\": \"y\"}\n");
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(file + ":2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("body"), std::string::npos) << msg;

  // A number beyond a double's range aborted with nlohmann's bare message, which
  // --skip-invalid-json did not skip; it now reads as null (PythonsNanAndInfinityReadAsNull). The
  // parser took a NUL byte for the end of the line and dropped the record after it.
  o.text_field = "text";
  write_text(file, std::string("{\"text\": \"a\", \"n\": 1e400}\n{\"text\": \"b\"}\0{\"text\": \"c\"}\n{\"text\": \"d\"}\n", 68));
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(file + ":2: invalid JSON (a NUL byte at column 14)"), std::string::npos) << msg;
  o.skip_invalid_json = true;
  const PrepareReport skipped = prepare_dataset(o, tok);
  EXPECT_EQ(skipped.skipped_json_lines, 1);
  EXPECT_EQ(skipped.num_documents, 2);  // "a" and "d"
  o.skip_invalid_json = false;
  write_text(file, std::string("{\"text\": \"b\"}\0{\"text\": \"c\"}\n", 28));
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(file + ":1: invalid JSON (a NUL byte at column 14)"), std::string::npos) << msg;
}

// Python's json.dumps writes NaN, Infinity and -Infinity, and json.loads reads 1e999 as inf: a
// record holding one of them in another field stopped the prepare (or was skipped), its text unread.
// They read as null where they stand, outside strings only; a text that is one of them is no text,
// and a misspelt one is still invalid JSON. A .json file of such lines is JSON Lines too.
TEST(DataPrepare, PythonsNanAndInfinityReadAsNull) {
  const std::string dir = test::temp_dir("prepare_python_nan");
  write_text(dir + "/a.jsonl", "{\"text\": \"one\", \"score\": NaN}\n"
                               "{\"text\": \"two\", \"w\": [Infinity, -Infinity, 1e999, -1E+999, 2.5e-3, -0]}\n"
                               "{\"text\": \"NaN, Infinity \\\" 1e999\", \"x\": \"NaN\"}\n"
                               "{\"text\": \"NaN \\\" -Infinity\", \"y\": -Infinity}\n");
  write_text(dir + "/b.json", "{\"text\": \"four\", \"loss\": NaN}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/a.jsonl", dir + "/b.json"};
  o.output_dir = dir + "/out";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 5);
  EXPECT_EQ(r.python_values_as_null, 4);  // the third line has them only inside strings
  EXPECT_NE(r.to_string().find("prepare: read NaN, Infinity or numbers beyond a double's range as null on 4 JSONL lines"),
            std::string::npos) << r.to_string();
  Shard s(dir + "/out/train-00000.bin");
  EXPECT_EQ(tok.decode(shard_tokens(s)), "one<|endoftext|>two<|endoftext|>NaN, Infinity \" 1e999<|endoftext|>"
                                         "NaN \" -Infinity<|endoftext|>four<|endoftext|>");
  o.overwrite = true;
  for (const auto& [line, problem] : {std::pair{"{\"text\": NaN}", ":1: no string field \"text\""},
                                      std::pair{"{\"text\": \"x\", \"v\": NaNa}", ":1: invalid JSON (parse error"},
                                      std::pair{"{\"text\": \"x\", \"v\": nan}", ":1: invalid JSON (parse error"},
                                      // Malformed numbers whose start overflows stay malformed (a review, 2026-12-02).
                                      std::pair{"{\"text\": \"x\", \"v\": 01e400}", ":1: invalid JSON (parse error"},
                                      std::pair{"{\"text\": \"x\", \"v\": [1e400.5]}", ":1: invalid JSON ("},
                                      std::pair{"{\"text\": \"x\", \"v\": [1.e400]}", ":1: invalid JSON (parse error"}}) {
    write_text(dir + "/a.jsonl", std::string(line) + "\n");
    const std::string msg = error_of([&] { prepare_dataset(o, tok); });
    EXPECT_NE(msg.find(dir + "/a.jsonl" + problem), std::string::npos) << line << ": " << msg;
  }
}

// A .json file whose first line is an object with the text field is JSON Lines, as datasets'
// to_json names them and Hugging Face's json loader reads them: its raw JSON was trained on as text,
// with exit 0. A .json file of another shape stays text. --text-field where no input is JSON Lines
// is an error (it was ignored). An upper-case extension is JSON Lines too.
TEST(DataPrepare, JsonFilesOfJsonLinesAndTextFieldWithoutThem) {
  const std::string dir = test::temp_dir("prepare_text_field");
  write_text(dir + "/docs.json", "\n{\"body\": \"abc\"}\n{\"body\": \"de\"}\n");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/docs.json"};
  o.output_dir = dir + "/out";
  o.text_field = "body";
  PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 2);
  EXPECT_EQ(r.num_tokens, 4 + 3);  // abc<eos> de<eos>: the field's text, not the JSON
  // With the default field: JSON Lines beside a .json config, which is text.
  fs::create_directories(dir + "/mixed");
  write_text(dir + "/mixed/data.json", "{\"text\": \"first doc\"}\n{\"text\": \"second\"}\n");
  write_text(dir + "/mixed/settings.json", "{\"name\": \"x\"}\n");
  o.inputs = {dir + "/mixed"};
  o.text_field = "text";
  o.overwrite = true;
  r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_EQ(r.num_tokens, (9 + 1) + (6 + 1) + (14 + 1));  // two records, then settings.json's 14 bytes as text

  write_text(dir + "/notes.txt", "{\"body\": \"abc\"}\n");
  o.inputs = {dir + "/notes.txt"};
  o.text_field = "body";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: --text-field body applies to JSON Lines inputs (*.jsonl, *.ndjson, or *.json whose first "
                     "line is an object with that field), and none of the inputs is one (" + dir +
                     "/notes.txt would be read as plain text)"), std::string::npos) << msg;
  fs::rename(dir + "/docs.json", dir + "/DOCS.JSONL");
  o.inputs = {dir + "/DOCS.JSONL"};
  r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 2);
}

// A file named twice is read once: the report says so (repeating it on the command line, to
// upsample it, did nothing without a word).
TEST(DataPrepare, FileNamedTwiceIsReadOnceAndSaid) {
  const std::string dir = test::temp_dir("prepare_named_twice");
  write_text(dir + "/a.txt", "abc");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/a.txt", dir + "/./a.txt"};
  o.output_dir = dir + "/out";
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_tokens, 4);
  EXPECT_EQ(r.repeated_inputs, std::vector<std::string>{dir + "/./a.txt"});
  EXPECT_NE(r.to_string().find("prepare: read once: " + dir + "/./a.txt named again"), std::string::npos) << r.to_string();
}

TEST(DataPrepare, EmptyInputIsAnError) {
  const std::string dir = test::temp_dir("prepare_empty");
  write_text(dir + "/in/blank.txt", "  \n\n");
  write_text(dir + "/in/empty.txt", "");
  ByteTokenizer tok;
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.output_dir = dir + "/out";
  // The message says why each file gave nothing (it counted neither empty files nor blank documents).
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("prepare: no documents found in " + dir + "/in (2 files: 1 empty, 0 skipped as binary; 1 blank "
                     "document (whitespace only) and 0 invalid JSONL lines skipped, 0 documents dropped)"),
            std::string::npos) << msg;
  // The failed prepare takes back the output directory it created (review, 2026-12-01), and
  // leaves one that was there before.
  EXPECT_FALSE(std::filesystem::exists(dir + "/out"));
  o.output_dir = dir + "/new/deeper/out";  // every level it made goes, the test's folder stays
  error_of([&] { prepare_dataset(o, tok); });
  EXPECT_FALSE(std::filesystem::exists(dir + "/new"));
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  o.output_dir = dir + "/out";
  std::filesystem::create_directories(dir + "/out");
  error_of([&] { prepare_dataset(o, tok); });
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/out"));
  o.inputs = {dir + "/missing"};
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find(dir + "/missing"), std::string::npos) << msg;
}
