// Tests of the SmolLM2 byte-level BPE tokenizer: golden ids from an independent implementation (Hugging Face
// tokenizers, see scripts/make-tokenizer-golden), round trips, special tokens, chat format, streaming, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "specdec/llama/gguf.hpp"
#include "specdec/llama/tokenizer.hpp"
#include "support/gguf_writer.hpp"

using specdec::Token;
using specdec::llama::ChatMessage;
using specdec::llama::TextStream;
using specdec::llama::Tokenizer;

namespace {

/// The real SmolLM2 tokenizer, loaded once.
const Tokenizer& smollm2() {
  static const Tokenizer tokenizer = [] {
    const std::filesystem::path path = SPECDEC_MODEL_PATH;
    if (!std::filesystem::exists(path))
      FAIL("model file " << path << " is missing: run scripts/fetch-model");
    return Tokenizer::from_gguf(specdec::gguf::File::open(path));
  }();
  return tokenizer;
}

struct GoldenSample {
  std::string text;
  std::vector<Token> ids;
};

/// Undoes the escaping of scripts/make-tokenizer-golden: \\ \t \n \r \xHH.
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    if (c == 't') out += '\t';
    else if (c == 'n') out += '\n';
    else if (c == 'r') out += '\r';
    else if (c == 'x') {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else out += c;
  }
  return out;
}

std::vector<GoldenSample> read_golden() {
  const std::filesystem::path path = std::filesystem::path(SPECDEC_TEST_DATA) / "tokenizer_golden.tsv";
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open " << path);
  std::vector<GoldenSample> samples;
  bool header = true;  // the leading '#' lines; a sample's text may start with '#' too (C++'s "#include")
  for (std::string line; std::getline(in, line);) {
    if (header && line.starts_with("#")) continue;
    header = false;
    const std::size_t tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    GoldenSample sample{unescape(line.substr(0, tab)), {}};
    std::istringstream ids(line.substr(tab + 1));
    for (Token id; ids >> id;) sample.ids.push_back(id);
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> words;
  for (auto w : specdec::llama::detail::split_words(text)) words.emplace_back(w);
  return words;
}

/// A tiny vocabulary over {a, b, c, space}: merges "a b" (rank 0), "b c" (1), "ab c" (2), "Ġ a" (3), "b b" (4).
Tokenizer toy_tokenizer() {
  Tokenizer::Vocabulary v;
  v.tokens = {"<s>", "a", "b", "c", "\xC4\xA0", "ab", "bc", "abc", "\xC4\xA0" "a", "bb"};
  v.types = {3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  v.merges = {"a b", "b c", "ab c", "\xC4\xA0 a", "b b"};
  v.bos = 0;
  v.eos = 0;
  return Tokenizer(std::move(v));
}

/// An in-memory GGUF with a 3-token vocabulary {a, b, ab} and one merge.
struct TinyGguf {
  std::string model = "gpt2";
  std::string pre = "smollm";  // empty: no key
  std::vector<std::int32_t> types{};
  std::optional<std::uint32_t> bos{};
  std::vector<std::string> merges = {"a b"};

  specdec::gguf::File build() const {
    specdec::testing::GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
    w.add_array_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
    if (!types.empty()) w.add_array_int32("tokenizer.ggml.token_type", types);
    w.add_array_strings("tokenizer.ggml.merges", merges);
    if (bos) w.add_uint32("tokenizer.ggml.bos_token_id", *bos);
    return specdec::gguf::File::from_bytes(w.finish(), "tiny.gguf");
  }
};

const std::string kDefaultSystem =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

}  // namespace

TEST_CASE("encode reproduces the ids of the independent hugging face tokenizer for every golden sample",
          "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  const auto samples = read_golden();
  REQUIRE(samples.size() >= 40);
  // The C++ sample, whose text starts with '#', is read as a sample (it was once skipped as a comment).
  CHECK(std::any_of(samples.begin(), samples.end(),
                    [](const GoldenSample& s) { return s.text.starts_with("#include"); }));
  for (const auto& sample : samples) {
    INFO("text: \"" << sample.text << "\"");
    CHECK(tok.encode(sample.text) == sample.ids);
  }
}

TEST_CASE("the smollm2 vocabulary has the expected size, special ids and stop tokens", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.size() == 49152);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK(tok.stop_tokens() == std::vector<Token>{2, 0});
  CHECK(tok.is_control(1));
  CHECK_FALSE(tok.is_control(17));
  CHECK(tok.tokens()[17] == "!");
  CHECK(tok.find("\xC4\xA0the") == tok.encode(" the").at(0));
}

TEST_CASE("decode inverts encode on utf-8, digits, whitespace runs, code and invalid bytes", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  const std::vector<std::string> texts = {
      "Hello, world!",  "  two  spaces  and trailing   ", "\t\ttabs\n\n\nnewlines\r\n", "π ≈ 3.14159265358979",
      "日本語 한국어 Ελληνικά עברית العربية", "emoji 🤖🧠🚀 zwj 👩‍💻", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
      "invalid \xC3 utf-8 \x80 truncated \xE6\x97", "x"};
  for (const auto& text : texts) {
    INFO("text: \"" << text << "\"");
    CHECK(tok.decode(tok.encode(text)) == text);
    CHECK(tok.decode(tok.encode(text, false)) == text);
  }
  CHECK(tok.encode("").empty());
  // Bytes with no single-byte token in SmolLM2's vocabulary (e.g. 0x04, 0xC0, 0xFF) are dropped, as in llama.cpp.
  CHECK(tok.decode(tok.encode("a\x04" "b\xC0\xFF")) == "ab");
  // Such a byte blocks merges across it, as in llama.cpp (Hugging Face tokenizers would give "!!" = 10095).
  CHECK(tok.encode("!\x04!") == std::vector<Token>{17, 17});
  // first_dropped_byte finds them: exactly the bytes that encode drops, outside special tokens.
  CHECK(tok.first_dropped_byte("a\x04" "b\xC0\xFF") == 1u);
  CHECK(tok.first_dropped_byte("invalid \xC3 utf-8 \x80 truncated \xE6\x97 kept") == std::nullopt);
  CHECK(tok.first_dropped_byte("<|im_start|>user\n\xFE") == 17u);
  CHECK(tok.first_dropped_byte("") == std::nullopt);
  std::size_t dropped = 0;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    INFO("byte " << b);
    CHECK(tok.first_dropped_byte(one).has_value() == tok.encode(one).empty());
    dropped += tok.encode(one).empty();
  }
  CHECK(dropped == 21);  // the count encode's comment gives
}

TEST_CASE("special tokens are parsed only with parse_special and decode to nothing", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.encode("<|im_start|>") == std::vector<Token>{1});
  const auto as_text = tok.encode("<|im_start|>", false);
  CHECK(as_text.size() > 1);
  CHECK(std::find(as_text.begin(), as_text.end(), 1) == as_text.end());
  CHECK(tok.decode(as_text) == "<|im_start|>");

  const auto ids = tok.encode("<|im_start|>user\nHi<|im_end|>");
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(tok.decode(ids) == "user\nHi");
  CHECK(tok.token_bytes(2) == "<|im_end|>");
  CHECK(tok.token_bytes(tok.encode(" the").at(0)) == " the");
}

TEST_CASE("chat_prompt renders smollm2 chatml with the default system turn", "[tokenizer]") {
  CHECK(Tokenizer::chat_prompt("Hello") ==
        kDefaultSystem + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");

  const std::vector<ChatMessage> with_system = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}};
  CHECK(Tokenizer::chat_prompt(with_system, false) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n");

  // As the file's jinja template renders an empty list: the system turn comes with the first message only.
  CHECK(Tokenizer::chat_prompt(std::span<const ChatMessage>{}) == "<|im_start|>assistant\n");
  CHECK(Tokenizer::chat_prompt(std::span<const ChatMessage>{}, false).empty());

  const auto ids = smollm2().encode(Tokenizer::chat_prompt("Hello"));
  CHECK(std::count(ids.begin(), ids.end(), 1) == 3);
  CHECK(std::count(ids.begin(), ids.end(), 2) == 2);
}

// A stream keeps a pointer to its tokenizer: a temporary one would be gone before the first push.
static_assert(std::is_constructible_v<TextStream, const Tokenizer&> && !std::is_constructible_v<TextStream, Tokenizer>);

TEST_CASE("text stream holds back a multi-byte character split across tokens", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  // "é" is C3 A9: the single-byte tokens for C3 and A9 arrive separately.
  const Token c3 = *tok.find("\xC3\x83");
  const Token a9 = *tok.find("\xC2\xA9");
  TextStream stream(tok);
  std::string head;
  for (Token t : tok.encode("caf")) head += stream.push(t);
  CHECK(head == "caf");
  CHECK(stream.push(c3).empty());
  CHECK(stream.push(a9) == "\xC3\xA9");
  CHECK(stream.push(2).empty());

  // Token by token, the pieces concatenate to the original text; each piece is whole characters.
  const std::string text = "Emoji 😀 and CJK 日本語 and more";
  TextStream s2(tok);
  std::string joined;
  for (Token t : tok.encode(text)) {
    const std::string piece = s2.push(t);
    for (std::size_t pos = 0; pos < piece.size();) {  // whole characters only: none cut at the piece's end
      const auto c = specdec::llama::detail::decode_utf8(piece, pos);
      CHECK(c.valid);
      pos += c.length;
    }
    joined += piece;
  }
  joined += s2.flush();
  CHECK(joined == text);

  TextStream s3(tok);
  CHECK(s3.push(c3).empty());
  CHECK(s3.flush() == "\xC3");
}

TEST_CASE("the pre-tokenizer isolates digits and follows the gpt-2 regex", "[tokenizer]") {
  using V = std::vector<std::string>;
  CHECK(split(" 2024") == V{" ", "2", "0", "2", "4"});
  CHECK(split("a   b") == V{"a", "  ", " b"});
  CHECK(split("end   ") == V{"end", "   "});
  CHECK(split("don't I'M") == V{"don", "'t", " I", "'", "M"});
  CHECK(split(" ...!? x") == V{" ...!?", " x"});
  CHECK(split("x\n\n  y") == V{"x", "\n\n ", " y"});
  CHECK(split("ab12") == V{"ab", "1", "2"});
  CHECK(split("naïve мир") == V{"naïve", " мир"});
  CHECK(split("١٢") == V{"١", "٢"});
}

TEST_CASE("character classes follow unicode 15.1 like llama.cpp", "[tokenizer]") {
  using specdec::llama::detail::CharClass;
  using specdec::llama::detail::classify;
  CHECK(classify(U'é') == CharClass::letter);
  CHECK(classify(U'\u0301') == CharClass::other);      // combining mark
  CHECK(classify(U'\u00BD') == CharClass::number);     // ½
  CHECK(classify(U'\u3000') == CharClass::whitespace);
  CHECK(classify(U'\u200B') == CharClass::other);      // zero width space is not White_Space
  CHECK(classify(0x31350) == CharClass::letter);        // CJK extension H, Unicode 15.0
  CHECK(classify(0x2EBF0) == CharClass::letter);        // CJK extension I, Unicode 15.1
  CHECK(classify(0x11F50) == CharClass::number);        // Kawi digit zero, Unicode 15.0
  CHECK(classify(0x11380) == CharClass::other);         // Tulu-Tigalari, Unicode 16.0: not in llama.cpp's tables
  CHECK(classify(0x10FFFF) == CharClass::other);
}

TEST_CASE("bpe merges the lowest-ranked pair first and the leftmost one on a tie", "[tokenizer]") {
  const Tokenizer tok = toy_tokenizer();
  CHECK(tok.encode("abc") == std::vector<Token>{7});  // a b -> ab (rank 0), ab c -> abc
  CHECK(tok.encode("bc") == std::vector<Token>{6});
  CHECK(tok.encode("abab") == std::vector<Token>{5, 5});
  CHECK(tok.encode("bcab") == std::vector<Token>{6, 5});
  CHECK(tok.encode("cab") == std::vector<Token>{3, 5});
  CHECK(tok.encode(" a") == std::vector<Token>{8});
  CHECK(tok.encode("bbb") == std::vector<Token>{9, 2});  // tie: the leftmost pair merges
  CHECK(tok.encode("<s>a") == std::vector<Token>{0, 1});
  CHECK(tok.encode("z").empty());  // no token for the byte: dropped

  // A rule listed twice keeps its first rank, as llama.cpp does (Hugging Face's tokenizers keeps the last): with
  // "b c" between the two copies of "a b", "abc" merges a b first.
  Tokenizer::Vocabulary v;
  v.tokens = {"a", "b", "c", "ab", "bc"};
  v.types = {1, 1, 1, 1, 1};
  v.merges = {"a b", "b c", "a b"};
  CHECK(Tokenizer(std::move(v)).encode("abc") == std::vector<Token>{3, 2});

  // A single character whose token is not of type normal still takes part in the merges when special tokens are
  // not parsed, as in llama.cpp, which looks tokens up by their text: "a" is a control token here.
  Tokenizer::Vocabulary c;
  c.tokens = {"a", "b", "ab"};
  c.types = {3, 1, 1};
  c.merges = {"a b"};
  const Tokenizer control(std::move(c));
  CHECK(control.encode("ab", false) == std::vector<Token>{2});
  CHECK(control.encode("ba", false) == std::vector<Token>{1, 0});
  CHECK(control.encode("ab") == std::vector<Token>{0, 1});  // parsed as the special token first
  CHECK(control.first_dropped_byte("ab", false) == std::nullopt);
}

TEST_CASE("tokenizer errors name the bad value and what was expected", "[tokenizer]") {
  const Tokenizer tok = toy_tokenizer();
  const std::vector<Token> bad = {1, 10};
  REQUIRE_THROWS_WITH(tok.decode(bad), Catch::Contains("token id 10") && Catch::Contains("vocabulary of 10 tokens"));
  REQUIRE_THROWS_WITH(smollm2().decode(std::vector<Token>{-1}),
                      Catch::Contains("token id -1") && Catch::Contains("49152"));

  Tokenizer::Vocabulary v;
  v.tokens = {"a", "b"};
  v.types = {1};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("1 token types") && Catch::Contains("(2)"));
  v.types = {};
  v.eos = 5;
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("eos token id 5"));
  v.eos = -1;
  v.merges = {"ab"};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("merge 0 \"ab\""));
  REQUIRE_THROWS_WITH(Tokenizer(Tokenizer::Vocabulary{}), Catch::Contains("vocabulary is empty"));
  // Merges over strings that are not tokens, and token types outside TokenType, are errors (a file whose tables
  // disagree), not rules to skip.
  v.tokens = {"a", "b", "ab"};
  v.merges = {"a b", "a c"};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("merge 1 \"a c\"") && Catch::Contains("\"c\" is not a token"));
  v.merges = {"b a"};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("merge 0 \"b a\"") && Catch::Contains("\"ba\" is not a token"));
  v.merges = {"a b"};
  v.types = {1, 1, 7};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("token_type of token 2 is 7, expected 0 to 6"));
  v.types = {1, -1, 1};
  REQUIRE_THROWS_WITH(Tokenizer(v), Catch::Contains("token_type of token 1 is -1"));

  CHECK(Tokenizer::from_gguf(TinyGguf{}.build()).encode("ab") == std::vector<Token>{2});
  // The pre-tokenizer keeps 32-bit offsets: a text of 2 GiB is refused before a byte of it is read (the view
  // points at 3 real bytes, its length says 2 GiB).
  const std::string three = "abc";
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{}.build()).encode(std::string_view(three.data(), std::size_t{1} << 31)),
                      "tokenizer input of 2147483648 bytes, at most 2147483647 supported");
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.pre = ""}.build()),
                      Catch::Contains("tiny.gguf: no tokenizer.ggml.pre key, expected \"smollm\""));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.model = "llama"}.build()),
                      Catch::Contains("tokenizer.ggml.model is \"llama\"") && Catch::Contains("\"gpt2\""));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.pre = "llama3"}.build()),
                      Catch::Contains("tokenizer.ggml.pre is \"llama3\""));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.types = {1, 1}}.build()),
                      Catch::Contains("tiny.gguf: ") && Catch::Contains("2 token types") && Catch::Contains("(3)"));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.types = {1, 99, 1}}.build()),
                      Catch::Contains("tiny.gguf: tokenizer.ggml.token_type of token 1 is 99"));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.merges = {"a b", "b b"}}.build()),
                      Catch::Contains("tiny.gguf: ") && Catch::Contains("\"bb\" is not a token"));
  REQUIRE_THROWS_WITH(Tokenizer::from_gguf(TinyGguf{.bos = 7}.build()),
                      Catch::Contains("tokenizer.ggml.bos_token_id is 7") && Catch::Contains("size 3"));
}
