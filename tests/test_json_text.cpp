// The --json output of specdec-generate: model text as JSON string literals, whatever bytes it holds.
#include <catch2/catch.hpp>

#include <string>

#include "../examples/json_text.hpp"

using examples::json_string;

TEST_CASE("json strings keep well-formed utf-8 and escape the rest", "[cli]") {
  CHECK(json_string("a\"b\\c\n\t\r\x01") == "\"a\\\"b\\\\c\\n\\t\\r\\u0001\"");
  CHECK(json_string("\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF") ==
        "\"\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF\"");  // é € 😀 U+10FFFF
  // Every byte that does not start a well-formed character becomes U+FFFD: lone continuation bytes, cut
  // sequences, overlong forms, surrogates, code points above U+10FFFF, and the bytes F5-FF.
  CHECK(json_string("\x80") == "\"\\ufffd\"");
  CHECK(json_string("\xC3") == "\"\\ufffd\"");
  CHECK(json_string("\xC0\x80") == "\"\\ufffd\\ufffd\"");
  CHECK(json_string("\xE0\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xF0\x80\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xED\xA0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xF4\x90\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xF5\x80\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xFF") == "\"\\ufffd\"");
  CHECK(json_string("\xED\x9F\xBF") == "\"\xED\x9F\xBF\"");  // U+D7FF, just below the surrogates
}

TEST_CASE("streamed text is valid utf-8 with the bytes json_string replaces replaced", "[cli]") {
  using examples::utf8_text;
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(utf8_text("caf\xC3\xA9 \xF0\x9F\x98\x80") == "caf\xC3\xA9 \xF0\x9F\x98\x80");
  CHECK(utf8_text("\xF0\x9F\x98") == fffd + fffd + fffd);  // a character cut at the end of generation
  CHECK(utf8_text("a\x80z") == "a" + fffd + "z");
  CHECK(utf8_text("\xC0\x80") == fffd + fffd);
  CHECK(utf8_text("\xED\xA0\x80") == fffd + fffd + fffd);
  CHECK(utf8_text("\xFF") == fffd);
  // The same bytes as json_string replaces: one U+FFFD for each \ufffd escape.
  const std::string mixed = "x\xC3\xA9\xE2\x82\xF4\x90\x80\x80 \xF0\x9F\x98\x80\xC3";
  const std::string json = json_string(mixed);
  std::size_t escapes = 0;
  for (std::size_t at = json.find("\\ufffd"); at != std::string::npos; at = json.find("\\ufffd", at + 1)) ++escapes;
  std::size_t replacements = 0;
  const std::string text = utf8_text(mixed);
  for (std::size_t at = text.find(fffd); at != std::string::npos; at = text.find(fffd, at + 1)) ++replacements;
  CHECK(escapes == 7);
  CHECK(replacements == escapes);
}
