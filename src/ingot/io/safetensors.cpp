// safetensors reader and writer.
// Invariants:
// - A reader exists only after every header it owns has been validated in full: known dtypes,
//   non-negative dims, byte sizes equal to numel x dtype size, and offsets that tile the data
//   section exactly (sorted by offset, each tensor starts where the previous ends, the last ends at
//   the end of the file). So no tensor is read out of bounds and no two tensors share bytes.
// - SafeTensorInfo::data points into a read-only mapping owned by the reader's Impl; Impl lives on
//   the heap, so moving a reader keeps every pointer valid. Tensors in a mapping need not be
//   aligned (the format does not promise it), so conversions read elements through memcpy.
// - Every error names the file (and tensor, key or value) at fault.
// - Writers produce 8-byte aligned data sections (the header is padded with spaces), tensors laid
//   out in sorted name order, and each file appears at its final name only when complete.
#include "ingot/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <regex>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ingot/core/broken_link.h"
#include "ingot/core/mapped_files.h"
#include "ingot/io/json_util.h"

namespace ingot::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";
// safetensors' own reference implementation refuses headers above 100 MB; so do we, so that a
// corrupt length field cannot make us allocate or parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// ---- dtypes ---------------------------------------------------------------------------------

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {{"BF16", DType::bf16}, {"F16", DType::f16}, {"F32", DType::f32},
                                     {"F64", DType::f64},   {"I32", DType::i32}, {"I64", DType::i64},
                                     {"U8", DType::u8},     {"U16", DType::u16}};

bool dtype_from_safetensors(const std::string& name, DType* out) {
  for (const auto& entry : kDTypeNames)
    if (name == entry.name) {
      *out = entry.dtype;
      return true;
    }
  return false;
}

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& entry : kDTypeNames)
    if (entry.dtype == dtype) return entry.name;
  return "?";
}

std::string supported_dtype_list() {
  std::string list;
  for (const auto& entry : kDTypeNames) list += (list.empty() ? "" : ", ") + std::string(entry.name);
  return list;
}

bool is_float(DType t) { return t == DType::bf16 || t == DType::f16 || t == DType::f32 || t == DType::f64; }
bool is_signed_int(DType t) { return t == DType::i32 || t == DType::i64; }

// Which conversions Ingot performs: float <-> float (any widths), i32 <-> i64, and identity.
bool can_convert(DType from, DType to) {
  if (from == to) return true;
  if (is_float(from) && is_float(to)) return true;
  return is_signed_int(from) && is_signed_int(to);
}

// ---- element conversion ---------------------------------------------------------------------

template <typename T>
inline T load_unaligned(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
template <typename T>
inline void store_unaligned(unsigned char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

// double -> float with round-to-odd. Rounding that result to bf16/f16 (RNE) then equals rounding
// the double directly, because float keeps more than 2p+2 bits for p = 8 (bf16) and p = 11 (f16);
// plain double -> float -> bf16 would round twice and can be off by one ulp.
inline float f64_to_f32_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 1u) == 0) f = std::nextafter(f, static_cast<double>(f) > d ? -INFINITY : INFINITY);
  }
  return f;
}

// Converts n elements between float dtypes. Loads go through double only when f64 is involved
// (exact for every narrower source); otherwise through float.
void convert_float(const unsigned char* src, DType from, unsigned char* dst, DType to, int64_t n) {
  auto run = [&](auto load, auto store) {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 20))
    for (int64_t i = 0; i < n; ++i) store(dst, i, load(src, i));
  };
  auto dispatch_store = [&](auto load) {
    switch (to) {
      case DType::f32:
        run(load, [](unsigned char* d, int64_t i, auto v) { store_unaligned<float>(d + 4 * i, static_cast<float>(v)); });
        break;
      case DType::f64:
        run(load, [](unsigned char* d, int64_t i, auto v) { store_unaligned<double>(d + 8 * i, static_cast<double>(v)); });
        break;
      case DType::bf16:
        run(load, [](unsigned char* d, int64_t i, auto v) {
          float f;
          if constexpr (std::is_same_v<decltype(v), double>) f = f64_to_f32_round_to_odd(v); else f = v;
          store_unaligned<uint16_t>(d + 2 * i, f32_to_bf16(f));
        });
        break;
      case DType::f16:
        run(load, [](unsigned char* d, int64_t i, auto v) {
          float f;
          if constexpr (std::is_same_v<decltype(v), double>) f = f64_to_f32_round_to_odd(v); else f = v;
          store_unaligned<uint16_t>(d + 2 * i, f32_to_f16(f));
        });
        break;
      default: break;  // excluded by can_convert
    }
  };
  switch (from) {
    case DType::bf16:
      if (to == DType::f64)
        dispatch_store([](const unsigned char* s, int64_t i) { return static_cast<double>(bf16_to_f32(load_unaligned<uint16_t>(s + 2 * i))); });
      else
        dispatch_store([](const unsigned char* s, int64_t i) { return bf16_to_f32(load_unaligned<uint16_t>(s + 2 * i)); });
      break;
    case DType::f16:
      if (to == DType::f64)
        dispatch_store([](const unsigned char* s, int64_t i) { return static_cast<double>(f16_to_f32(load_unaligned<uint16_t>(s + 2 * i))); });
      else
        dispatch_store([](const unsigned char* s, int64_t i) { return f16_to_f32(load_unaligned<uint16_t>(s + 2 * i)); });
      break;
    case DType::f32:
      if (to == DType::f64)
        dispatch_store([](const unsigned char* s, int64_t i) { return static_cast<double>(load_unaligned<float>(s + 4 * i)); });
      else
        dispatch_store([](const unsigned char* s, int64_t i) { return load_unaligned<float>(s + 4 * i); });
      break;
    case DType::f64:
      dispatch_store([](const unsigned char* s, int64_t i) { return load_unaligned<double>(s + 8 * i); });
      break;
    default: break;  // excluded by can_convert
  }
}

// Converts n elements from `from` to `to` (can_convert must hold). `what` describes the tensor for
// the only error possible here: an i64 value that does not fit i32.
void convert_elements(const void* src_ptr, DType from, void* dst_ptr, DType to, int64_t n,
                      const std::string& what) {
  auto* src = static_cast<const unsigned char*>(src_ptr);
  auto* dst = static_cast<unsigned char*>(dst_ptr);
  if (from == to) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(from)));
    return;
  }
  if (is_float(from)) return convert_float(src, from, dst, to, n);
  if (from == DType::i32 && to == DType::i64) {
    for (int64_t i = 0; i < n; ++i) store_unaligned<int64_t>(dst + 8 * i, load_unaligned<int32_t>(src + 4 * i));
    return;
  }
  // i64 -> i32: narrowing must not silently wrap (token ids, positions).
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = load_unaligned<int64_t>(src + 8 * i);
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      fail(what, ": element ", i, " = ", v, " does not fit in i32");
    store_unaligned<int32_t>(dst + 4 * i, static_cast<int32_t>(v));
  }
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

// ---- header ---------------------------------------------------------------------------------

// A SAX pass over a JSON document that finds the first top-level key given twice. (The DOM parser's
// callback mode, which could do this while parsing, rescans the parent object at every closing
// brace: quadratic in the tensor count, minutes for a header of 300k tensors.)
struct TopLevelKeys {
  std::set<std::string> seen;
  std::string duplicate;
  int depth = 0;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth > 0; }
  bool end_object() { return --depth >= 0; }
  bool start_array(std::size_t) { return ++depth > 0; }
  bool end_array() { return --depth >= 0; }
  bool key(json::string_t& name) {
    if (depth == 1 && !seen.insert(name).second && duplicate.empty()) duplicate = name;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception&) { return false; }  // parsed before
};

// ---- mapped files ---------------------------------------------------------------------------

// A whole file mapped read-only. Invariant: size >= 8 (shorter files are rejected before mapping).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("cannot open safetensors file ", path, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail("cannot stat safetensors file ", path, ": ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("safetensors file ", path, " is not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ < 8) {
      ::close(fd);
      fail("safetensors file ", path, " is truncated: ", size_, " bytes, shorter than the 8-byte header length");
    }
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (p == MAP_FAILED) fail("cannot map safetensors file ", path, ": ", std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
    record_ = MappedFileRecord(p, size_, path);  // a SIGBUS in the mapping names this file
  }
  ~MappedFile() {
    record_ = MappedFileRecord();
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  MappedFileRecord record_;
};

// Reads a JSON integer that must be >= 0 into *out; false if it is not one.
bool json_to_nonnegative(const json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

// Validates the header of `file` and appends its tensors to *tensors (unsorted) and its
// "__metadata__" to *metadata (existing keys win).
void parse_safetensors_header(const MappedFile& file, std::vector<SafeTensorInfo>* tensors,
                              std::map<std::string, std::string>* metadata) {
  const std::string& path = file.path();
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(file.data()[i]) << (8 * i);  // little-endian
  if (header_len > kMaxHeaderBytes)
    fail("safetensors file ", path, ": header length ", header_len, " exceeds the ", kMaxHeaderBytes,
         "-byte limit (corrupt or not a safetensors file)");
  if (header_len > file.size() - 8)
    fail("safetensors file ", path, " is truncated: header length ", header_len, " needs ", 8 + header_len,
         " bytes but the file has ", file.size());

  const std::string header_text(reinterpret_cast<const char*>(file.data()) + 8, header_len);
  // The JSON parser stops at a NUL and skips a byte-order mark: bytes it never reads would pass.
  if (const size_t nul = header_text.find('\0'); nul != std::string::npos)
    fail("safetensors file ", path, ": header holds a NUL byte at offset ", 8 + nul, " (corrupt)");
  if (header_text.starts_with("\xEF\xBB\xBF"))
    fail("safetensors file ", path, ": header starts with a byte-order mark, which safetensors does not allow");
  check_json_nesting(header_text, path, "safetensors header of");
  json header;
  try {
    header = json::parse(header_text);
  } catch (const json::exception& e) {
    fail("safetensors file ", path, ": header is not valid JSON: ", json_error_text(e));
  }
  // JSON objects keep the last of duplicate keys; a header naming one tensor twice is corrupt.
  TopLevelKeys keys;
  json::sax_parse(header_text, &keys);
  const std::string& duplicate = keys.duplicate;
  if (!duplicate.empty()) fail("safetensors file ", path, ": tensor \"", duplicate, "\" appears twice in the header");
  if (!header.is_object())
    fail("safetensors file ", path, ": header must be a JSON object, got ", json_type_name(header));

  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file.size() - data_begin;
  struct Span {
    uint64_t begin, end;
    size_t index;  // into tensors
  };
  std::vector<Span> spans;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        fail("safetensors file ", path, ": \"__metadata__\" must be an object of strings, got ", json_brief(entry));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          fail("safetensors file ", path, ": \"__metadata__\" key \"", key, "\" must be a string, got ",
               json_brief(value));
        metadata->emplace(key, value.get<std::string>());
      }
      continue;
    }
    const std::string where = "safetensors file " + path + ": tensor \"" + name + "\"";
    if (!entry.is_object()) fail(where, ": entry must be an object, got ", json_brief(entry));
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key)) fail(where, ": missing \"", key, "\"");

    SafeTensorInfo info;
    info.name = name;
    info.file = path;

    const json& dtype = entry["dtype"];
    if (!dtype.is_string()) fail(where, ": \"dtype\" must be a string, got ", json_brief(dtype));
    if (!dtype_from_safetensors(dtype.get<std::string>(), &info.dtype))
      fail(where, ": unsupported dtype \"", dtype.get<std::string>(), "\"; Ingot reads ", supported_dtype_list());

    const json& shape = entry["shape"];
    if (!shape.is_array()) fail(where, ": \"shape\" must be an array of integers, got ", json_brief(shape));
    if (shape.size() > static_cast<size_t>(Tensor::kMaxDims))
      fail(where, ": rank ", shape.size(), " exceeds Ingot's maximum of ", Tensor::kMaxDims);
    int64_t numel = 1;
    for (const json& dim : shape) {
      if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0)
        fail(where, ": shape ", json_brief(shape), " has a negative dimension");
      uint64_t d = 0;
      if (!json_to_nonnegative(dim, &d) || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(where, ": shape ", json_brief(shape), " must hold non-negative integers");
      info.shape.push_back(static_cast<int64_t>(d));
      if (__builtin_mul_overflow(numel, static_cast<int64_t>(d), &numel))
        fail(where, ": shape ", json_brief(shape), " overflows 64-bit element count");
    }

    const json& offsets = entry["data_offsets"];
    uint64_t begin = 0, end = 0;
    if (!offsets.is_array() || offsets.size() != 2 || !json_to_nonnegative(offsets[0], &begin) ||
        !json_to_nonnegative(offsets[1], &end))
      fail(where, ": \"data_offsets\" must be two non-negative integers [begin, end], got ", json_brief(offsets));
    if (end < begin) fail(where, ": data_offsets ", json_brief(offsets), " are not ascending (end < begin)");
    if (end > data_size)
      fail("safetensors file ", path, " is truncated: tensor \"", name, "\" data_offsets ", json_brief(offsets),
           " reach past the data section of ", data_size, " bytes");
    int64_t expected_bytes = 0;
    if (__builtin_mul_overflow(numel, dtype_size(info.dtype), &expected_bytes) ||
        static_cast<uint64_t>(expected_bytes) != end - begin)
      fail(where, ": data_offsets ", json_brief(offsets), " span ", end - begin, " bytes but ", dtype.get<std::string>(),
           " ", shape_string(info.shape), " needs ", numel, " x ", dtype_size(info.dtype), " bytes");
    info.bytes = static_cast<int64_t>(end - begin);
    info.data = file.data() + data_begin + begin;
    spans.push_back({begin, end, tensors->size()});
    tensors->push_back(std::move(info));
  }

  // The tensors must tile [0, data_size) exactly: no overlap, no holes, no trailing bytes.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Span& span : spans) {
    const std::string& name = (*tensors)[span.index].name;
    if (span.begin < covered)
      fail("safetensors file ", path, ": tensor \"", name, "\" (bytes ", span.begin, "..", span.end,
           ") overlaps tensor \"", *previous, "\" (which ends at ", covered, ")");
    if (span.begin > covered)
      fail("safetensors file ", path, ": bytes ", covered, "..", span.begin,
           " of the data section belong to no tensor (hole before tensor \"", name, "\")");
    covered = span.end;
    previous = &name;
  }
  if (covered != data_size)
    fail("safetensors file ", path, ": data section has ", data_size, " bytes but the tensors cover only ", covered,
         " (", data_size - covered, " trailing bytes)");
}

bool is_shard_file_name(const std::string& name) {
  static const std::regex pattern(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(name, pattern);
}

std::string shard_file_name(int index, int count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "model-%05d-of-%05d.safetensors", index, count);
  return buffer;
}

void remove_if_exists(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) fail("cannot remove stale ", path.string(), ": ", ec.message());
}

}  // namespace

// ---- reader ---------------------------------------------------------------------------------

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct SafeTensorsReader::Impl {
  std::string path;                                  // what open() was given
  std::vector<std::unique_ptr<MappedFile>> files;    // owners of every SafeTensorInfo::data
  std::map<std::string, SafeTensorInfo> tensors;
  std::map<std::string, std::string> metadata;

  // Maps and validates one file; adds its tensors, rejecting names another file already holds.
  void add_file(const std::string& file_path) {
    files.push_back(std::make_unique<MappedFile>(file_path));
    std::vector<SafeTensorInfo> found;
    parse_safetensors_header(*files.back(), &found, &metadata);
    for (auto& info : found) {
      auto [it, inserted] = tensors.emplace(info.name, info);
      if (!inserted)
        fail("tensor \"", info.name, "\" appears in two shards: ", it->second.file, " and ", file_path);
    }
  }

  void open_index(const std::string& index_path) {
    const json index = parse_json(read_text_file(index_path, "safetensors index"), index_path, "safetensors index");
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("safetensors index ", index_path, ": missing \"weight_map\" object (tensor name -> shard file)");
    const fs::path dir = fs::path(index_path).parent_path();
    std::map<std::string, std::string> weight_map;  // tensor -> shard path
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string() || shard.get<std::string>().empty())
        fail("safetensors index ", index_path, ": weight_map entry for tensor \"", name,
             "\" must be a shard file name, got ", json_brief(shard));
      // A shard is a file of the model's folder: an index that reaches outside it (an absolute path,
      // a ".." step) would read whatever file it names as weights, which a downloaded model must not.
      const fs::path relative = fs::path(shard.get<std::string>());
      if (relative.is_absolute() || relative.has_root_name() || relative.has_root_directory() ||
          std::find(relative.begin(), relative.end(), fs::path("..")) != relative.end())
        fail("safetensors index ", index_path, ": weight_map entry for tensor \"", name, "\" names shard \"",
             relative.string(), "\", which lies outside the model's folder ", dir.string());
      // Normal form: "b.safetensors" and "./b.safetensors" are one shard, not two holding the same tensors.
      const std::string shard_path = (dir / relative).lexically_normal().string();
      if (const std::string link = broken_link_description(shard_path); !link.empty())
        fail("safetensors index ", index_path, " names shard ", shard_path, " (for tensor \"", name, "\"), ", link);
      std::error_code ec;
      if (!fs::exists(shard_path, ec))
        fail("safetensors index ", index_path, " names shard ", shard_path, " (for tensor \"", name,
             "\"), which does not exist");
      weight_map.emplace(name, shard_path);
      shards.insert(shard_path);
    }
    if (shards.empty()) fail("safetensors index ", index_path, ": weight_map is empty");
    for (const std::string& shard : shards) add_file(shard);
    for (const auto& [name, shard] : weight_map) {
      auto it = tensors.find(name);
      if (it == tensors.end() || it->second.file != shard)
        fail("safetensors index ", index_path, " places tensor \"", name, "\" in shard ", shard,
             ", which does not contain it");
    }
  }
};

SafeTensorsReader::SafeTensorsReader() : impl_(std::make_unique<Impl>()) {}
SafeTensorsReader::SafeTensorsReader(SafeTensorsReader&&) noexcept = default;
SafeTensorsReader& SafeTensorsReader::operator=(SafeTensorsReader&&) noexcept = default;
SafeTensorsReader::~SafeTensorsReader() = default;

SafeTensorsReader SafeTensorsReader::open(const std::string& path) {
  SafeTensorsReader reader;
  Impl& impl = *reader.impl_;
  impl.path = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) fail("safetensors path ", path, " does not exist");
  if (fs::is_directory(status)) {
    // Same precedence as transformers: a single model.safetensors wins over an index.
    const fs::path single = fs::path(path) / kSingleFileName, index = fs::path(path) / kIndexFileName;
    // A link whose target is gone (a Hugging Face cache's snapshot links into blobs/) is named as such:
    // "holds neither" sent the user looking for a file that is there.
    if (fs::exists(single, ec)) {
      impl.add_file(single.string());
    } else if (fs::exists(index, ec)) {
      impl.open_index(index.string());
    } else {
      for (const fs::path& file : {single, index})
        if (const std::string link = broken_link_description(file); !link.empty()) fail(file.string(), " is ", link);
      fail("directory ", path, " holds neither ", kSingleFileName, " nor ", kIndexFileName);
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    impl.open_index(path);
  } else {
    impl.add_file(path);
  }
  return reader;
}

bool SafeTensorsReader::contains(const std::string& name) const { return impl_->tensors.count(name) != 0; }

const SafeTensorInfo& SafeTensorsReader::get(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) fail("tensor \"", name, "\" not found in ", impl_->path);
  return it->second;
}

std::vector<std::string> SafeTensorsReader::names() const {
  std::vector<std::string> result;
  result.reserve(impl_->tensors.size());
  for (const auto& entry : impl_->tensors) result.push_back(entry.first);
  return result;
}

const std::map<std::string, std::string>& SafeTensorsReader::metadata() const { return impl_->metadata; }

void SafeTensorsReader::read_into(const std::string& name, Tensor dst) const {
  const SafeTensorInfo& info = get(name);
  const std::string what = "tensor \"" + name + "\" in " + info.file;
  if (dst.device != Device::cpu) fail("cannot read ", what, " into a device tensor; read into host memory first");
  bool same_shape = dst.ndim == static_cast<int>(info.shape.size());
  for (int i = 0; same_shape && i < dst.ndim; ++i) same_shape = dst.shape[i] == info.shape[i];
  if (!same_shape)
    fail(what, " has shape ", shape_string(info.shape), " but the destination expects ", dst.shape_string());
  if (!can_convert(info.dtype, dst.dtype))
    fail("cannot convert ", what, " from ", safetensors_dtype_name(info.dtype), " to ", dtype_name(dst.dtype));
  if (dst.numel() > 0 && !dst.present()) fail("cannot read ", what, ": destination has no storage");
  convert_elements(info.data, info.dtype, dst.data, dst.dtype, info.numel(), what);
}

// ---- writer ---------------------------------------------------------------------------------

namespace {

// Where writing float dtype `from` as `to` can overflow: the smallest magnitude that rounds to inf
// there (0 when none can), the largest finite value, and the dtypes to write instead.
struct NarrowRange {
  double rounds_to_inf_from = 0, largest = 0;
  const char* instead = "";
};
NarrowRange narrow_range(DType from, DType to) {
  if (!is_float(from) || from == to || from == DType::f16) return {};  // f16 fits every other float dtype
  // Halfway between the largest finite value and the next power of two: round-to-nearest-even
  // takes it to inf, since the largest finite value's last mantissa bit is odd.
  if (to == DType::f16) return {65520.0, 65504.0, "bf16 or f32"};
  if (to == DType::bf16 && from != DType::bf16) return {std::ldexp(2 - std::ldexp(1, -8), 127), std::ldexp(2 - std::ldexp(1, -7), 127), "f32"};
  if (to == DType::f32 && from == DType::f64) return {std::ldexp(2 - std::ldexp(1, -24), 127), std::numeric_limits<float>::max(), "f64"};
  return {};
}

// The tensors sorted by name, after checking everything that could fail mid-write, so that no file
// is touched when the input is bad. `path` names the file or directory being written.
std::vector<const TensorToWrite*> sorted_checked(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    const std::string where = "writing " + path + ": tensor \"" + t.name + "\"";
    if (t.name.empty() || t.name == "__metadata__") fail("writing ", path, ": invalid tensor name \"", t.name, "\"");
    if (i > 0 && sorted[i - 1]->name == t.name) fail(where, " is given twice");
    if (t.tensor.device != Device::cpu) fail(where, " is not a host tensor");
    if (t.tensor.numel() > 0 && !t.tensor.present()) fail(where, " has no data");
    if (safetensors_dtype_name(t.dtype_on_disk)[0] == '?')
      fail(where, ": dtype ", dtype_name(t.dtype_on_disk), " has no safetensors name");
    if (!can_convert(t.tensor.dtype, t.dtype_on_disk))
      fail(where, ": cannot convert ", dtype_name(t.tensor.dtype), " to ", safetensors_dtype_name(t.dtype_on_disk));
    for (int d = 0; d < t.tensor.ndim; ++d)
      if (t.tensor.shape[d] < 0) fail(where, ": negative dimension in shape ", t.tensor.shape_string());
    if (const NarrowRange range = narrow_range(t.tensor.dtype, t.dtype_on_disk); range.rounds_to_inf_from > 0) {
      // A finite weight beyond the disk dtype's range would be written as inf (an export another
      // reader, Ingot included, then refuses).
      const auto* bytes = static_cast<const unsigned char*>(t.tensor.data);
      for (int64_t j = 0; j < t.tensor.numel(); ++j) {
        const double v = t.tensor.dtype == DType::f64   ? load_unaligned<double>(bytes + 8 * j)
                         : t.tensor.dtype == DType::f32 ? load_unaligned<float>(bytes + 4 * j)
                         : t.tensor.dtype == DType::f16 ? f16_to_f32(load_unaligned<uint16_t>(bytes + 2 * j))
                                                        : bf16_to_f32(load_unaligned<uint16_t>(bytes + 2 * j));
        if (std::isfinite(v) && std::fabs(v) >= range.rounds_to_inf_from)
          fail(where, ": element ", j, " = ", v, " is beyond ", dtype_name(t.dtype_on_disk), "'s range (largest ",
               range.largest, "); write ", range.instead, " instead");
      }
    }
    if (t.tensor.dtype == DType::i64 && t.dtype_on_disk == DType::i32) {
      // Narrowing can fail on a value; check now rather than after other shards are written.
      for (int64_t j = 0; j < t.tensor.numel(); ++j) {
        const int64_t v = t.tensor.ptr<const int64_t>()[j];
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          fail(where, ": element ", j, " = ", v, " does not fit in I32");
      }
    }
  }
  return sorted;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<const TensorToWrite*> sorted = sorted_checked(path, tensors);

  json header = json::object();
  json meta = json::object();
  meta["format"] = "pt";  // what transformers checks before trusting a safetensors file
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;

  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    const uint64_t bytes = static_cast<uint64_t>(t.tensor.numel() * dtype_size(t.dtype_on_disk));
    json shape = json::array();
    for (int d = 0; d < t.tensor.ndim; ++d) shape.push_back(t.tensor.shape[d]);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype_on_disk)},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    fail("writing ", path, ": cannot encode the header (tensor names and metadata must be UTF-8): ", e.what());
  }
  // Spaces are JSON whitespace; padding keeps the data section 8-byte aligned for readers that map it.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  AtomicFileWriter file(path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  file.write(length, 8);
  file.write(header_text.data(), header_text.size());
  std::vector<unsigned char> buffer;
  constexpr int64_t kChunkElements = int64_t{1} << 22;  // bounds the conversion buffer (<= 32 MiB)
  for (const TensorToWrite* t : sorted) {
    const int64_t n = t->tensor.numel();
    if (n == 0) continue;
    if (t->tensor.dtype == t->dtype_on_disk) {
      file.write(t->tensor.data, static_cast<size_t>(t->tensor.bytes()));
      continue;
    }
    const int64_t src_size = dtype_size(t->tensor.dtype), dst_size = dtype_size(t->dtype_on_disk);
    buffer.resize(static_cast<size_t>(std::min(n, kChunkElements) * dst_size));
    for (int64_t start = 0; start < n; start += kChunkElements) {
      const int64_t count = std::min(kChunkElements, n - start);
      convert_elements(static_cast<const unsigned char*>(t->tensor.data) + start * src_size, t->tensor.dtype,
                       buffer.data(), t->dtype_on_disk, count, "writing " + path + ": tensor \"" + t->name + "\"");
      file.write(buffer.data(), static_cast<size_t>(count * dst_size));
    }
  }
  file.commit();
}

void write_safetensors_sharded(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               int64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes <= 0) fail("writing ", dir, ": max_shard_bytes must be positive, got ", max_shard_bytes);
  const std::vector<const TensorToWrite*> sorted = sorted_checked(dir, tensors);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create directory ", dir, ": ", ec.message());
  auto bytes_of = [](const TensorToWrite* t) { return t->tensor.numel() * dtype_size(t->dtype_on_disk); };
  int64_t total = 0;
  for (const auto* t : sorted) total += bytes_of(t);

  const fs::path single = fs::path(dir) / kSingleFileName, index_path = fs::path(dir) / kIndexFileName;
  // Shards a previous export left behind; removed once the new layout is complete so that the
  // directory never mixes two exports.
  std::vector<fs::path> old_shards;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_shard_file_name(entry.path().filename().string())) old_shards.push_back(entry.path());

  if (total <= max_shard_bytes) {
    write_safetensors(single.string(), tensors, metadata);
    remove_if_exists(index_path);
    for (const auto& p : old_shards) remove_if_exists(p);
    return;
  }

  // Greedy fill in name order: a shard closes when the next tensor would overflow it; a tensor
  // larger than the limit gets a shard of its own (transformers does the same).
  std::vector<std::vector<TensorToWrite>> groups(1);
  int64_t group_bytes = 0;
  for (const auto* t : sorted) {
    if (!groups.back().empty() && group_bytes + bytes_of(t) > max_shard_bytes) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(*t);
    group_bytes += bytes_of(t);
  }
  const int count = static_cast<int>(groups.size());
  json weight_map = json::object();
  std::set<std::string> written;
  for (int i = 0; i < count; ++i) {
    const std::string name = shard_file_name(i + 1, count);
    write_safetensors((fs::path(dir) / name).string(), groups[i], metadata);
    written.insert(name);
    for (const auto& t : groups[i]) weight_map[t.name] = name;
  }
  // A stale model.safetensors would shadow the index in transformers, so it goes before the index
  // appears; the index is written last so it never names a shard that is not complete.
  remove_if_exists(single);
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically(index_path.string(), index.dump(2) + "\n");
  for (const auto& p : old_shards)
    if (!written.count(p.filename().string())) remove_if_exists(p);
}

}  // namespace ingot::io
