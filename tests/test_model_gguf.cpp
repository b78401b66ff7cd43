// SPDX-License-Identifier: MIT
// model/gguf.hpp and model/gguf_writer.hpp: the real stories260K file,
// writer round trips of every value and tensor type, and corrupt files.
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/gguf_writer.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::model;

namespace {
std::span<const std::byte> as_span(const std::vector<std::byte>& v) { return {v.data(), v.size()}; }

template <class V>
void poke(std::vector<std::byte>& image, std::size_t at, V v) {
  std::memcpy(image.data() + at, &v, sizeof(V));
}

// A small valid image: one u32 key, a string key, one 2x3 f32 tensor.
std::vector<std::byte> small_image() {
  gguf_writer w;
  w.add("a.count", std::uint32_t{7});
  w.add("a.name", std::string_view("xy"));
  std::vector<float> t{1, 2, 3, 4, 5, 6};
  w.add_tensor("t", ggml_type::f32, {3, 2}, std::as_bytes(std::span(t)));
  return w.bytes();
}
// Offsets in small_image(): header 24; key "a.count" (8 + 7) + type 4 + u32 4
// = 23 -> 47; key "a.name" (8 + 6) + type 4 + string (8 + 2) = 28 -> 75;
// tensor info: name (8 + 1), n_dims 4 @84, dims 16 @88, type 4 @104, offset 8 @108.
constexpr std::size_t tensor_type_at = 104;
constexpr std::size_t tensor_offset_at = 108;
constexpr std::size_t tensor_ndims_at = 84;
}  // namespace

TEST_CASE("gguf: reads the vendored stories260K file") {
  const auto f = gguf_file::open(LLMKIT_DEFAULT_MODEL);
  REQUIRE(f.version() == 3);
  REQUIRE(f.alignment() == 32);
  REQUIRE(f.metadata().size() == 19);
  REQUIRE(f.tensors().size() == 48);
  REQUIRE(f.data_offset() == 14176);
  REQUIRE(f.get<std::string_view>("general.architecture") == "llama");
  REQUIRE(f.get<std::string_view>("tokenizer.ggml.model") == "llama");
  REQUIRE(f.get<std::uint32_t>("llama.embedding_length") == 64);
  REQUIRE(f.get<std::int64_t>("llama.block_count") == 5);
  REQUIRE(f.get<float>("llama.attention.layer_norm_rms_epsilon") == Approx(1e-5f));
  REQUIRE_FALSE(f.get_optional<float>("llama.rope.freq_base").has_value());
  REQUIRE(f.get<std::uint32_t>("tokenizer.ggml.bos_token_id") == 1);
  const auto& tokens = f.get_array("tokenizer.ggml.tokens");
  REQUIRE(tokens.type() == gguf_type::string);
  REQUIRE(tokens.size() == 512);
  REQUIRE(tokens.strings()[0] == "<unk>");
  REQUIRE(tokens.strings()[259] == "\xe2\x96\x81t");  // "▁t"
  const auto& scores = f.get_array("tokenizer.ggml.scores");
  REQUIRE(scores.get<float>(262) == -3.0f);
  REQUIRE(f.get_array("tokenizer.ggml.token_type").get<std::int32_t>(3) == 6);

  const auto& emb = f.tensor("token_embd.weight");
  REQUIRE(emb.type == ggml_type::f32);
  REQUIRE(emb.n_dims == 2);
  REQUIRE(emb.cols() == 64);
  REQUIRE(emb.rows() == 512);
  REQUIRE(emb.n_bytes == 64 * 512 * 4);
  float first[2];
  std::memcpy(first, emb.data, sizeof first);
  REQUIRE(first[0] == Approx(-0.29474878f));
  REQUIRE(first[1] == Approx(0.56189561f));
  const auto& k0 = f.tensor("blk.0.attn_k.weight");
  REQUIRE(k0.cols() == 64);
  REQUIRE(k0.rows() == 32);
  float last_norm;
  std::memcpy(&last_norm, f.tensor("blk.4.ffn_norm.weight").data + 63 * 4, 4);
  REQUIRE(last_norm == Approx(1.2342612f));
  REQUIRE(f.find_tensor("nope") == nullptr);
  REQUIRE_THROWS_WITH(f.tensor("nope"), "gguf: missing tensor 'nope'");
  REQUIRE_THROWS_WITH(f.get<std::uint32_t>("nope"), "gguf: missing metadata key 'nope'");
  REQUIRE_THROWS_WITH(f.get<std::uint32_t>("general.name"),
                      Catch::Contains("'general.name' has type string"));
  REQUIRE_THROWS_AS(gguf_file::open("/nonexistent/model.gguf"), llmkit::error);
}

TEST_CASE("gguf: writer round trip of every value type, nested arrays and tensor types") {
  for (std::uint32_t version : {2u, 3u}) {
    for (std::uint32_t alignment : {32u, 64u, 1u}) {
      gguf_writer w(version, alignment);
      w.add("u8", std::uint8_t{200});
      w.add("i8", std::int8_t{-100});
      w.add("u16", std::uint16_t{60000});
      w.add("i16", std::int16_t{-30000});
      w.add("u32", std::uint32_t{4000000000u});
      w.add("i32", std::int32_t{-2000000000});
      w.add("f32", 1.5f);
      w.add("bool", true);
      w.add("str", std::string_view("h\xc3\xa9llo"));
      w.add("u64", std::uint64_t{1} << 63);
      w.add("i64", std::int64_t{-1} << 62);
      w.add("f64", -2.25);
      const std::vector<std::int16_t> shorts{-1, 2, -3};
      w.add_array("arr.i16", std::span<const std::int16_t>(shorts));
      const std::vector<double> doubles{0.5, -1e300};
      w.add_array("arr.f64", std::span<const double>(doubles));
      const std::vector<std::string> strs{"", "a", "\xe2\x96\x81the"};
      w.add_string_array("arr.str", std::span<const std::string>(strs));
      const std::vector<std::uint32_t> empty;
      w.add_array("arr.empty", std::span<const std::uint32_t>(empty));
      // [[1, 2], []] as u8 arrays inside an array.
      std::vector<std::byte> nested;
      gguf_writer::put<std::uint32_t>(nested, 9);
      gguf_writer::put<std::uint64_t>(nested, 2);
      gguf_writer::put<std::uint32_t>(nested, 0);
      gguf_writer::put<std::uint64_t>(nested, 2);
      gguf_writer::put<std::uint8_t>(nested, 1);
      gguf_writer::put<std::uint8_t>(nested, 2);
      gguf_writer::put<std::uint32_t>(nested, 0);
      gguf_writer::put<std::uint64_t>(nested, 0);
      w.add_raw("arr.nested", 9, nested);

      std::vector<float> f32s(6);
      for (std::size_t i = 0; i < f32s.size(); ++i) f32s[i] = 0.25f * float(i) - 1.0f;
      w.add_tensor("f32", ggml_type::f32, {3, 2}, std::as_bytes(std::span(f32s)));
      std::vector<f16> halves(5);
      for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = to_f16(float(i) * 0.5f);
      w.add_tensor("f16", ggml_type::f16, {5}, std::as_bytes(std::span(halves)));
      std::vector<bf16> bhalves(4 * 1 * 2 * 1);
      w.add_tensor("bf16", ggml_type::bf16, {4, 1, 2, 1}, std::as_bytes(std::span(bhalves)));
      std::vector<block_q8_0> blocks(2);
      blocks[1].qs[31] = -7;
      blocks[1].scale = to_f16(0.5f);
      w.add_tensor("q8", ggml_type::q8_0, {32, 2}, std::as_bytes(std::span(blocks)));

      const auto image = w.bytes();
      const gguf_file f(as_span(image));
      REQUIRE(f.version() == version);
      REQUIRE(f.alignment() == alignment);
      REQUIRE(f.get<std::uint8_t>("u8") == 200);
      REQUIRE(f.get<int>("i8") == -100);
      REQUIRE(f.get<std::uint16_t>("u16") == 60000);
      REQUIRE(f.get<std::int16_t>("i16") == -30000);
      REQUIRE(f.get<std::uint32_t>("u32") == 4000000000u);
      REQUIRE(f.get<std::int32_t>("i32") == -2000000000);
      REQUIRE(f.get<float>("f32") == 1.5f);
      REQUIRE(f.get<bool>("bool"));
      REQUIRE(f.get<std::string_view>("str") == "h\xc3\xa9llo");
      REQUIRE(f.get<std::uint64_t>("u64") == std::uint64_t{1} << 63);
      REQUIRE(f.get<std::int64_t>("i64") == std::int64_t{-1} << 62);
      REQUIRE(f.get<double>("f64") == -2.25);
      REQUIRE(type_of(*f.find("f64")) == gguf_type::f64);
      // Integer conversions are exact or refused.
      REQUIRE_THROWS_WITH(f.get<std::int32_t>("u32"), Catch::Contains("'u32' has type u32 (4000000000)"));
      REQUIRE_THROWS_AS(f.get<std::uint8_t>("i8"), llmkit::error);
      REQUIRE_THROWS_AS(f.get<int>("f32"), llmkit::error);
      REQUIRE_THROWS_AS(f.get<bool>("u8"), llmkit::error);
      const auto& a16 = f.get_array("arr.i16");
      REQUIRE(a16.type() == gguf_type::i16);
      REQUIRE(a16.size() == 3);
      REQUIRE(a16.get<int>(2) == -3);
      REQUIRE_THROWS_AS(a16.get<int>(3), llmkit::error);
      REQUIRE_THROWS_AS(a16.get<unsigned>(0), llmkit::error);
      REQUIRE(f.get_array("arr.f64").get<double>(1) == -1e300);
      const auto s = f.get_array("arr.str").strings();
      REQUIRE(s.size() == 3);
      REQUIRE(s[0].empty());
      REQUIRE(s[2] == "\xe2\x96\x81the");
      REQUIRE(f.get_array("arr.empty").empty());
      const auto nest = f.get_array("arr.nested").arrays();
      REQUIRE(nest.size() == 2);
      REQUIRE(nest[0].get<int>(1) == 2);
      REQUIRE(nest[1].empty());
      REQUIRE_THROWS_AS(f.get_array("str"), llmkit::error);

      REQUIRE(f.tensors().size() == 4);
      REQUIRE(f.data_offset() % alignment == 0);
      for (const auto& t : f.tensors()) REQUIRE(t.offset % alignment == 0);
      const auto& t32 = f.tensor("f32");
      REQUIRE(std::memcmp(t32.data, f32s.data(), 24) == 0);
      REQUIRE(f.tensor("f16").n_bytes == 10);
      REQUIRE(std::memcmp(f.tensor("f16").data, halves.data(), 10) == 0);
      REQUIRE(f.tensor("bf16").dims == std::array<std::uint64_t, 4>{4, 1, 2, 1});
      const auto& q = f.tensor("q8");
      REQUIRE(q.type == ggml_type::q8_0);
      REQUIRE(q.n_bytes == 68);
      REQUIRE(q.rows() == 2);
      block_q8_0 b;
      std::memcpy(&b, q.data + 34, 34);
      REQUIRE(b.qs[31] == -7);
      REQUIRE(to_f32(b.scale) == 0.5f);
    }
  }
}

TEST_CASE("gguf: deferred tensors are filled in order, as eager ones would be, in memory and in a file") {
  // Two writers of the same tensors, one eager and one with fills that
  // share a counter (as the synthetic writer's random stream is shared).
  std::vector<float> a(64), b(32);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(a.size() + i);
  gguf_writer eager(3, 64);
  eager.add("k", std::uint32_t{1});
  eager.add_tensor("a", ggml_type::f32, {64}, std::as_bytes(std::span(a)));
  eager.add_tensor("b", ggml_type::f32, {8, 4}, std::as_bytes(std::span(b)));

  gguf_writer lazy(3, 64);
  lazy.add("k", std::uint32_t{1});
  int next = 0, calls = 0;
  auto counting = [&](std::span<std::byte> out) {
    ++calls;
    for (std::size_t i = 0; i < out.size() / 4; ++i) {
      const float v = static_cast<float>(next++);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  };
  lazy.add_tensor("a", ggml_type::f32, std::vector<std::uint64_t>{64}, counting);
  lazy.add_tensor("b", ggml_type::f32, std::vector<std::uint64_t>{8, 4}, counting);
  REQUIRE(calls == 0);  // nothing is filled before the image is emitted
  REQUIRE(lazy.bytes() == eager.bytes());
  REQUIRE(calls == 2);

  next = 0;
  const std::string path = "test_model_gguf_deferred_tmp.gguf";
  lazy.write(path);
  REQUIRE(calls == 4);
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  const auto image = eager.bytes();
  REQUIRE(file.size() == image.size());
  REQUIRE(std::memcmp(file.data(), image.data(), image.size()) == 0);
  const gguf_file g(as_span(image));
  REQUIRE(g.tensor("b").dims[1] == 4);

  REQUIRE_THROWS_WITH(lazy.add_tensor("c", ggml_type::f32, std::vector<std::uint64_t>{4}, gguf_writer::tensor_fill{}),
                      Catch::Contains("'c'") && Catch::Contains("empty fill"));
  REQUIRE_THROWS_WITH(lazy.add_tensor("d", ggml_type::q8_0, std::vector<std::uint64_t>{16}, counting),
                      Catch::Contains("'d'") && Catch::Contains("block size"));
}

TEST_CASE("gguf: a file without tensors may end right after its metadata") {
  gguf_writer w;
  w.add("k", std::uint8_t{1});
  const auto image = w.bytes();
  REQUIRE(image.size() % 32 != 0);
  const gguf_file f(as_span(image));
  REQUIRE(f.tensors().empty());
  REQUIRE(f.data_offset() == image.size());
}

TEST_CASE("gguf: every truncation of a valid file is refused") {
  const auto image = small_image();
  REQUIRE_NOTHROW(gguf_file(as_span(image)));
  for (std::size_t n = 0; n < image.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    REQUIRE_THROWS_AS(gguf_file(std::span<const std::byte>(image.data(), n)), llmkit::error);
  }
  REQUIRE_THROWS_WITH(gguf_file(std::span<const std::byte>(image.data(), 10)),
                      "gguf: truncated file: tensor count needs 8 bytes at offset 8 but the file has 10 bytes");
}

TEST_CASE("gguf: bad header fields are refused with a message naming them") {
  const auto good = small_image();
  auto image = good;
  image[0] = std::byte{'X'};
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), "gguf: bad magic 0x46554758 (expected \"GGUF\")");
  for (std::uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    image = good;
    poke<std::uint32_t>(image, 4, v);
    REQUIRE_THROWS_WITH(gguf_file(as_span(image)), "gguf: unsupported version " + std::to_string(v) +
                                                         " (supported: 2, 3)");
  }
  image = good;
  poke<std::uint64_t>(image, 8, std::uint64_t{1} << 60);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::StartsWith("gguf: tensor count 1152921504606846976 is impossible"));
  image = good;
  poke<std::uint64_t>(image, 16, ~std::uint64_t{0});
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)),
                      Catch::StartsWith("gguf: metadata count 18446744073709551615 is impossible"));
  // A plausible but too-large count runs into the end of the file.
  image = good;
  poke<std::uint64_t>(image, 16, 3);
  REQUIRE_THROWS_AS(gguf_file(as_span(image)), llmkit::error);
}

TEST_CASE("gguf: hostile metadata lengths, types and nesting are refused") {
  auto image = small_image();
  poke<std::uint64_t>(image, 24, std::uint64_t{1} << 62);  // length of key "a.count"
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("metadata key at offset 24 has length 4611686018427387904"));
  image = small_image();
  poke<std::uint32_t>(image, 39, 13);  // value type of "a.count"
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), "gguf: unknown metadata value type 13 for metadata value type at offset 39");
  image = small_image();
  poke<std::uint64_t>(image, 65, ~std::uint64_t{0} - 3);  // length of the "xy" string value
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("string value at offset 65 has length 18446744073709551612"));

  {  // Array claiming 2^61 u32 elements.
    gguf_writer w;
    std::vector<std::byte> enc;
    gguf_writer::put<std::uint32_t>(enc, 4);
    gguf_writer::put<std::uint64_t>(enc, std::uint64_t{1} << 61);
    w.add_raw("huge", 9, enc);
    const auto img = w.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), Catch::Contains("claims 2305843009213693952 elements of u32"));
  }
  {  // Array of arrays nested too deeply.
    gguf_writer w;
    std::vector<std::byte> enc;
    for (int d = 0; d < 20; ++d) {
      gguf_writer::put<std::uint32_t>(enc, 9);
      gguf_writer::put<std::uint64_t>(enc, 1);
    }
    gguf_writer::put<std::uint32_t>(enc, 0);
    gguf_writer::put<std::uint64_t>(enc, 0);
    w.add_raw("deep", 9, enc);
    const auto img = w.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), Catch::StartsWith("gguf: metadata arrays nested deeper than 8"));
  }
  {  // Bad bool, duplicate key, bad alignment.
    gguf_writer w;
    const std::byte two[] = {std::byte{2}};
    w.add_raw("b", 7, two);
    auto img = w.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), Catch::Contains("is 2, not 0 or 1"));
    gguf_writer d;
    d.add("k", 1.0f);
    d.add("k", 2.0f);
    img = d.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), Catch::StartsWith("gguf: duplicate metadata key 'k'"));
    gguf_writer a;
    a.add("general.alignment", std::uint32_t{48});
    img = a.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), "gguf: general.alignment 48 is not a power of two");
    gguf_writer a2;
    a2.add("general.alignment", std::uint64_t{64});
    img = a2.bytes();
    REQUIRE_THROWS_WITH(gguf_file(as_span(img)), "gguf: general.alignment has type u64, expected u32");
  }
}

TEST_CASE("gguf: bad tensor infos are refused") {
  const auto good = small_image();
  auto image = good;
  poke<std::uint32_t>(image, tensor_type_at, 19);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)),
                      "gguf: tensor 't' has unsupported type IQ1_S (19) at offset 104; supported: F32, F16, BF16, Q8_0, "
                      "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS");
  // The other I-quants (IQ2, IQ3, IQ1_M) and the ternary types are refused by name too.
  for (const std::uint32_t code : {16u, 17u, 18u, 21u, 22u, 29u, 34u, 35u}) {
    image = good;
    poke<std::uint32_t>(image, tensor_type_at, code);
    REQUIRE_THROWS_WITH(gguf_file(as_span(image)),
                        Catch::Contains("unsupported type " + std::string(ggml_type_name(code)) + " (" +
                                        std::to_string(code) + ")"));
  }
  image = good;
  poke<std::uint32_t>(image, tensor_type_at, 1000);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("unsupported type ? (1000)"));
  image = good;
  poke<std::uint32_t>(image, tensor_type_at, 8);  // Q8_0 with a row of 3
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("row length 3, not a multiple of its block size 32"));
  image = good;
  poke<std::uint32_t>(image, tensor_type_at, 12);  // Q4_K with a row of 3
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("row length 3, not a multiple of its block size 256"));
  image = good;
  poke<std::uint64_t>(image, tensor_offset_at, 32);  // past the end of the 24 data bytes
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)),
                      "gguf: tensor 't' data [32, +24) runs past the end of the data section (24 bytes)");
  image = good;
  poke<std::uint64_t>(image, tensor_offset_at, ~std::uint64_t{0} - 31);  // aligned, wraps when added
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("runs past the end of the data section"));
  image = good;
  poke<std::uint64_t>(image, tensor_offset_at, 4);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), "gguf: tensor 't' offset 4 is not a multiple of the alignment 32");
  for (std::uint32_t nd : {0u, 5u, 0xffffffffu}) {
    image = good;
    poke<std::uint32_t>(image, tensor_ndims_at, nd);
    REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("has n_dims " + std::to_string(nd)));
  }
  image = good;
  poke<std::uint64_t>(image, tensor_ndims_at + 4, 0);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("dimension 0 = 0 is zero or makes the element count overflow"));
  image = good;
  poke<std::uint64_t>(image, tensor_ndims_at + 4, std::uint64_t{1} << 62);
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("dimension 1 = 2 is zero or makes"));
  image = good;
  image.resize(image.size() - 1);  // the last data byte is missing
  REQUIRE_THROWS_WITH(gguf_file(as_span(image)), Catch::Contains("runs past the end of the data section (23 bytes)"));
  // Duplicate tensor names.
  gguf_writer w;
  const float x = 1.0f;
  w.add_tensor("t", ggml_type::f32, {1}, std::as_bytes(std::span(&x, 1)));
  w.add_tensor("t", ggml_type::f32, {1}, std::as_bytes(std::span(&x, 1)));
  const auto img = w.bytes();
  REQUIRE_THROWS_WITH(gguf_file(as_span(img)), "gguf: duplicate tensor name 't'");
}

TEST_CASE("gguf: random byte corruption never crashes the reader") {
  const auto good = small_image();
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::size_t> where(0, good.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto image = good;
    const int n_flips = 1 + trial % 4;
    for (int k = 0; k < n_flips; ++k) image[where(rng)] = std::byte(byte(rng));
    try {
      const gguf_file f(as_span(image));
      for (const auto& t : f.tensors()) {
        REQUIRE(t.data >= image.data());
        REQUIRE(t.data + t.n_bytes <= image.data() + image.size());
      }
    } catch (const llmkit::error&) {
      ++refused;
    }
  }
  REQUIRE(refused > 0);
}
