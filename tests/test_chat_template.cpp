// SPDX-License-Identifier: MIT
// model/chat_template.hpp: every family formats a conversation to the text
// its reference Jinja template renders; detection on the real templates;
// names, GGUF, BOS handling and bad input.
#include <llmkit/model/chat_template.hpp>
#include <llmkit/model/detail/python_strip.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/harmony_stream.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace llmkit;
using namespace llmkit::model;

namespace {

// A system message, two user turns and an answer whose surrounding spaces
// show which templates trim.
const std::vector<chat_message> conversation{
    {"system", "You are a pirate."}, {"user", "Hello"}, {"assistant", "  Ahoy!  "}, {"user", "Who are you?"}};
const std::vector<chat_message> one_turn{{"user", "Hi"}};

constexpr chat_format_options exact{.prompt = generation_prompt::add, .bos = leading_bos::write};
constexpr chat_format_options exact_no_prompt{.prompt = generation_prompt::omit, .bos = leading_bos::write};

std::string format(std::string_view name, const std::vector<chat_message>& m, const chat_format_options& o = exact) {
  return chat_template::by_name(name).format(m, o);
}

// ---- Real tokenizer.chat_template strings (as stored in tokenizer_config.json
// on the Hugging Face Hub and copied into GGUF files by llama.cpp's converter).

// meta-llama/Meta-Llama-3-8B-Instruct
const std::string llama3_jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// meta-llama/Llama-3.1-8B-Instruct: the opening of its ~4 KB template, up to
// the system block (the rest handles tools and the other messages as Llama 3).
const std::string llama3_1_jinja = R"({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
)";

// Qwen/Qwen2-7B-Instruct
const std::string qwen2_jinja =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou "
    "are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";

// Qwen/Qwen2.5-7B-Instruct: its branch for a conversation without tools.
const std::string qwen2_5_jinja = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

// teknium/OpenHermes-2.5-Mistral-7B (plain ChatML)
const std::string chatml_jinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// meta-llama/Llama-2-7b-chat-hf
const std::string llama2_jinja =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

// mistralai/Mistral-7B-Instruct-v0.1, original template
const std::string mistral_v0_1_jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

// mistralai/Mistral-7B-Instruct-v0.2 and Mixtral-8x7B-Instruct-v0.1, original template
const std::string mistral_v0_2_jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

// mistralai/Mistral-7B-Instruct-v0.2, Mistral's later "v1" template with a system message
const std::string mistral_v1_jinja = R"({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)";

// mistralai/Mistral-7B-Instruct-v0.3 ("v3" template): its user-turn branch
// (the full template also checks alternation and writes tool calls).
const std::string mistral_v3_jinja = R"({{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- endif %}
{%- endfor %}
)";

// HuggingFaceH4/zephyr-7b-beta (also TinyLlama/TinyLlama-1.1B-Chat-v1.0)
const std::string zephyr_jinja =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% "
    "elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif "
    "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

// google/gemma-7b-it: no built-in family.
const std::string gemma_jinja =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
    "%}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

// microsoft/Phi-3-mini-4k-instruct: <|user|> and <|assistant|> as Zephyr, but <|end|> ends a turn.
const std::string phi3_jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
    "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') "
    "%}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}";

// Vicuna-style "USER: ... ASSISTANT:" turns: no built-in family.
const std::string vicuna_jinja =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\n' }}{% "
    "else %}{{ 'ASSISTANT: ' + message['content'] + eos_token + '\n' }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

// microsoft/Phi-3.5-mini-instruct
const std::string phi3_5_jinja =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
    "'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ "
    "eos_token }}{% endif %}";

// microsoft/Phi-4-mini-instruct
const std::string phi4_mini_jinja =
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
    "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + "
    "'<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";

// microsoft/phi-4
const std::string phi4_jinja =
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' "
    "+ message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant<|im_sep|>' }}{% endif %}";

// Qwen/Qwen3-0.6B: its generation prompt and thinking switch (the ~4 KB
// template also handles tools and splits answers at </think>).
const std::string qwen3_jinja = R"({%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})";

// mistralai/Mistral-Nemo-Instruct-2407 ("v3-tekken": no space after [INST]): no built-in family.
const std::string mistral_tekken_jinja = R"({%- if tools is not none and (message == user_messages[-1]) %}
    {{- "[AVAILABLE_TOOLS][" }}
{%- endif %}
{{- "[INST]" + message["content"] + "[/INST]" }}
)";

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const llmkit::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("chat_template: llama3 writes header, trimmed content and <|eot_id|> per message") {
  const std::string body =
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a pirate.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nAhoy!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>";
  const std::string prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  REQUIRE(format("llama3", conversation) == "<|begin_of_text|>" + body + prompt);
  REQUIRE(format("llama3", conversation, exact_no_prompt) == "<|begin_of_text|>" + body);
  REQUIRE(format("llama3", one_turn) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" + prompt);
}

TEST_CASE("chat_template: llama3.1 always opens with the dated system block") {
  const std::string system_block =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
      "Today Date: 26 Jul 2024\n\n";
  const std::string turns =
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nAhoy!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>";
  const std::string prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  REQUIRE(format("llama3.1", conversation) == system_block + "You are a pirate.<|eot_id|>" + turns + prompt);
  REQUIRE(format("llama3.1", conversation, exact_no_prompt) == system_block + "You are a pirate.<|eot_id|>" + turns);
  // No system message: the block is still there, empty after the date.
  REQUIRE(format("llama3.1", one_turn) ==
          system_block + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" + prompt);
  // The system message is trimmed; the date is the caller's when given.
  const std::vector<chat_message> padded{{"system", "\n Be brief. \n"}, {"user", "Hi"}};
  REQUIRE(chat_template::by_name("llama3.1").format(padded, {.prompt = generation_prompt::omit, .date = "03 Dec 2026"}) ==
          "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 03 Dec 2026"
          "\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST_CASE("chat_template: chatml, qwen2 and qwen2.5 write <|im_start|> turns, content untouched") {
  const std::string body =
      "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n  Ahoy!  <|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n";
  const std::string prompt = "<|im_start|>assistant\n";
  for (auto name : {"chatml", "qwen2", "qwen2.5"}) {
    INFO(name);
    REQUIRE(format(name, conversation) == body + prompt);
    REQUIRE(format(name, conversation, exact_no_prompt) == body);
  }
  const std::string hi = "<|im_start|>user\nHi<|im_end|>\n" + prompt;
  REQUIRE(format("chatml", one_turn) == hi);
  REQUIRE(format("qwen2", one_turn) == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + hi);
  REQUIRE(format("qwen2.5", one_turn) ==
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" + hi);
}

TEST_CASE("chat_template: llama2 puts <<SYS>> in the first turn and BOS before every [INST]") {
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a pirate.\n<</SYS>>\n\nHello [/INST] Ahoy! </s><s>[INST] Who are you? [/INST]";
  REQUIRE(format("llama2", conversation) == expected);
  REQUIRE(format("llama2", conversation, exact_no_prompt) == expected);  // the template has no assistant prefix
  REQUIRE(format("llama2", one_turn) == "<s>[INST] Hi [/INST]");
  // Rendered by a Jinja engine (huggingface.js's jinja tests, hf-internal-testing/llama-tokenizer's template).
  const std::vector<chat_message> hf{
      {"system", "You are a friendly chatbot who always responds in the style of a pirate"},
      {"user", "Hello, how are you?"},
      {"assistant", "I'm doing great. How can I help you today?"},
      {"user", "I'd like to show off how chat templating works!"}};
  REQUIRE(format("llama2", hf) ==
          "<s>[INST] <<SYS>>\nYou are a friendly chatbot who always responds in the style of a pirate\n<</SYS>>\n\n"
          "Hello, how are you? [/INST] I'm doing great. How can I help you today? </s><s>[INST] I'd like to show off "
          "how chat templating works! [/INST]");
}

TEST_CASE("chat_template: the mistral families") {
  REQUIRE(format("mistral", conversation) ==
          "<s>[INST] You are a pirate.\n\nHello [/INST]  Ahoy!  </s>[INST] Who are you? [/INST]");
  REQUIRE(format("mistral-v1", conversation) ==
          "<s> [INST] You are a pirate.\n\nHello [/INST]   Ahoy!  </s> [INST] Who are you? [/INST]");
  // v3: the system message joins the last user turn; answers are trimmed.
  REQUIRE(format("mistral-v3", conversation) ==
          "<s>[INST] Hello[/INST] Ahoy!</s>[INST] You are a pirate.\n\nWho are you?[/INST]");
  for (auto name : {"mistral", "mistral-v1", "mistral-v3"}) {
    INFO(name);
    REQUIRE(format(name, conversation, exact_no_prompt) == format(name, conversation));
  }
  REQUIRE(format("mistral", one_turn) == "<s>[INST] Hi [/INST]");
  REQUIRE(format("mistral-v1", one_turn) == "<s> [INST] Hi [/INST]");
  REQUIRE(format("mistral-v3", one_turn) == "<s>[INST] Hi[/INST]");
  // v3 after an answer: the system message would join a user turn that is not last, so it is dropped, as in Jinja.
  const std::vector<chat_message> ends_with_answer{{"system", "S"}, {"user", "Q"}, {"assistant", "A"}};
  REQUIRE(format("mistral-v3", ends_with_answer) == "<s>[INST] Q[/INST] A</s>");
  // Rendered by Jinja engines: Mixtral's template in huggingface.js's tests; Mistral's v1 and v3 templates in
  // llama.cpp's tests/test-chat-template.cpp (bos_token "", eos_token "</s>").
  const std::vector<chat_message> hf{{"user", "Hello, how are you?"},
                                     {"assistant", "I'm doing great. How can I help you today?"},
                                     {"user", "I'd like to show off how chat templating works!"}};
  REQUIRE(format("mistral", hf) ==
          "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s>[INST] I'd like to show "
          "off how chat templating works! [/INST]");
  const std::vector<chat_message> cpp{{"system", "You are a helpful assistant"}, {"user", "Hello"},
                                      {"assistant", "Hi there"},                 {"user", "Who are you"},
                                      {"assistant", "   I am an assistant   "},  {"user", "Another question"}};
  const auto no_bos = chat_format_options{.bos = leading_bos::omit};
  REQUIRE(format("mistral-v1", cpp, no_bos) ==
          " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
          "assistant   </s> [INST] Another question [/INST]");
  REQUIRE(format("mistral-v3", cpp, no_bos) ==
          "[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] You are a helpful "
          "assistant\n\nAnother question[/INST]");
}

TEST_CASE("chat_template: zephyr writes <|role|> turns ending in EOS") {
  const std::string body =
      "<|system|>\nYou are a pirate.</s>\n<|user|>\nHello</s>\n<|assistant|>\n  Ahoy!  </s>\n<|user|>\nWho are "
      "you?</s>\n";
  REQUIRE(format("zephyr", conversation) == body + "<|assistant|>\n");
  REQUIRE(format("zephyr", conversation, exact_no_prompt) == body);
  REQUIRE(format("zephyr", one_turn) == "<|user|>\nHi</s>\n<|assistant|>\n");
  // Rendered by huggingface.js's Jinja from zephyr-7b-beta's template (add_generation_prompt = true).
  const std::vector<chat_message> hf{
      {"system", "You are a friendly chatbot who always responds in the style of a pirate"},
      {"user", "How many helicopters can a human eat in one sitting?"}};
  REQUIRE(format("zephyr", hf) ==
          "<|system|>\nYou are a friendly chatbot who always responds in the style of a pirate</s>\n<|user|>\nHow many "
          "helicopters can a human eat in one sitting?</s>\n<|assistant|>\n");
  // The EOS text is the vocabulary's (StableLM Zephyr's is <|endoftext|>).
  REQUIRE(chat_template::by_name("zephyr").with_special_texts("", "<|endoftext|>").format(one_turn) ==
          "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
}

TEST_CASE("chat_template: leading_bos::omit drops exactly the BOS the template writes first") {
  for (auto name : chat_template::names) {
    INFO(name);
    const auto t = chat_template::by_name(name);
    const std::string with = t.format(conversation, exact);
    const std::string without = t.format(conversation);  // the default: omit, generation prompt added
    const bool writes_bos = name.starts_with("llama") || name.starts_with("mistral") || name == "gemma";
    if (writes_bos) {
      REQUIRE(with.starts_with(t.bos_text()));
      REQUIRE(without == with.substr(t.bos_text().size()));
    } else {
      REQUIRE(without == with);
    }
  }
  // Llama 2's BOS texts of later turns stay.
  REQUIRE(chat_template::by_name("llama2").format(conversation).starts_with("[INST] <<SYS>>"));
  REQUIRE(chat_template::by_name("llama2").format(conversation).find("</s><s>[INST] Who") != std::string::npos);
  REQUIRE(chat_template::by_name("chatml").format(one_turn) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat_template: trimming is Python's str.strip, Unicode whitespace included") {
  using llmkit::model::detail::python_strip;
  REQUIRE(python_strip("  a b \t\n") == "a b");
  REQUIRE(python_strip("\xe3\x80\x80x\xc2\xa0") == "x");         // U+3000, U+00A0
  REQUIRE(python_strip("\xe2\x80\x83x\xe2\x80\xa8\x1f") == "x");  // U+2003, U+2028, U+001F
  REQUIRE(python_strip("\xe2\x80\x8bx") == "\xe2\x80\x8bx");      // U+200B (zero width space) is not whitespace
  REQUIRE(python_strip("x\xe3\x80") == "x\xe3\x80");              // a truncated character is kept
  REQUIRE(python_strip("\x80 x") == "\x80 x");
  REQUIRE(python_strip(" \n ").empty());
  REQUIRE(python_strip("").empty());
  const std::vector<chat_message> ideographic{{"user", "\xe3\x80\x80Hi\xc2\xa0"}};
  REQUIRE(format("llama3", ideographic, exact_no_prompt) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST_CASE("chat_template: detects the family of real templates") {
  const std::vector<std::pair<const std::string*, std::string_view>> cases{
      {&llama3_jinja, "llama3"},        {&llama3_1_jinja, "llama3.1"},         {&qwen2_jinja, "qwen2"},
      {&qwen2_5_jinja, "qwen2.5"},      {&chatml_jinja, "chatml"},             {&llama2_jinja, "llama2"},
      {&mistral_v0_1_jinja, "mistral"}, {&mistral_v0_2_jinja, "mistral"},      {&mistral_v1_jinja, "mistral-v1"},
      {&mistral_v3_jinja, "mistral-v3"}, {&zephyr_jinja, "zephyr"},           {&gemma_jinja, "gemma"},
      {&phi3_jinja, "phi3"},            {&phi3_5_jinja, "phi3"},               {&phi4_mini_jinja, "phi4-mini"},
      {&phi4_jinja, "phi4"},            {&qwen3_jinja, "qwen3"}};
  for (const auto& [jinja, name] : cases) {
    INFO(name);
    REQUIRE(chat_template::detect(*jinja).name() == name);
  }
}

TEST_CASE("chat_template: an unknown template is an error naming the built-in families") {
  for (const std::string* jinja : {&vicuna_jinja, &mistral_tekken_jinja}) {
    const std::string e = error_of([&] { chat_template::detect(*jinja); });
    INFO(e);
    REQUIRE(e.find("is not one of the built-in families") != std::string::npos);
    REQUIRE(e.find("llama3, llama3.1, chatml, qwen2, qwen2.5, llama2, mistral, mistral-v1, mistral-v3, zephyr, "
                   "gemma, phi3, phi4-mini, phi4, qwen3, harmony") !=
            std::string::npos);
    REQUIRE(e.find("choose one of them by name") != std::string::npos);
  }
  // The message quotes the start of the template, newlines escaped.
  REQUIRE(error_of([] { chat_template::detect("{{ x }}\n{{ y }}"); }).find("'{{ x }}\\n{{ y }}'") != std::string::npos);
  REQUIRE(error_of([] { chat_template::detect(""); }).find("built-in families") != std::string::npos);
}

TEST_CASE("chat_template: by_name") {
  for (std::size_t i = 0; i < chat_template::names.size(); ++i) {
    const auto t = chat_template::by_name(chat_template::names[i]);
    REQUIRE(t.name() == chat_template::names[i]);
    REQUIRE(static_cast<std::size_t>(t.family()) == i);
  }
  const std::string e = error_of([] { chat_template::by_name("vicuna"); });
  REQUIRE(e ==
          "chat_template: no built-in template named 'vicuna'; the built-in ones are llama3, llama3.1, chatml, qwen2, "
          "qwen2.5, llama2, mistral, mistral-v1, mistral-v3, zephyr, gemma, phi3, phi4-mini, phi4, qwen3, harmony");
  REQUIRE_THROWS_AS(chat_template::by_name(""), llmkit::error);
  REQUIRE_THROWS_AS(chat_template::by_name("Llama3"), llmkit::error);
  REQUIRE(chat_template::by_name("llama3").end_of_turn_text() == "<|eot_id|>");
  REQUIRE(chat_template::by_name("qwen2.5").end_of_turn_text() == "<|im_end|>");
  REQUIRE(chat_template::by_name("zephyr").end_of_turn_text() == "</s>");
  REQUIRE(chat_template::by_name("llama2").with_special_texts("<s>", "<eos>").end_of_turn_text() == "<eos>");
}

TEST_CASE("chat_template: bad conversations are errors") {
  const auto llama3 = chat_template::by_name("llama3");
  REQUIRE(error_of([&] { llama3.format(std::vector<chat_message>{}); }) == "chat_template llama3: no messages to format");
  REQUIRE(error_of([&] { llama3.format(std::vector<chat_message>{{"user", "a"}, {"tool", "b"}}); }) ==
          "chat_template llama3: message 1 has role 'tool'; the roles are system, user and assistant");
  for (auto name : {"llama2", "mistral", "mistral-v1", "mistral-v3"}) {
    INFO(name);
    const auto t = chat_template::by_name(name);
    const std::string e = error_of([&] { t.format(std::vector<chat_message>{{"system", "s"}, {"assistant", "a"}}); });
    REQUIRE(e.find("roles must alternate user / assistant") != std::string::npos);
    REQUIRE(e.find("message 1 is 'assistant'") != std::string::npos);
    REQUIRE_THROWS_AS(t.format(std::vector<chat_message>{{"user", "a"}, {"user", "b"}}), llmkit::error);
    REQUIRE_THROWS_AS(t.format(std::vector<chat_message>{{"user", "a"}, {"system", "b"}}), llmkit::error);
  }
  // The other families take any order of the three roles, as their templates do.
  REQUIRE(format("chatml", {{"assistant", "a"}, {"assistant", "b"}}, exact_no_prompt) ==
          "<|im_start|>assistant\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n");
}

namespace {
// A vocab-only GGUF: a few tokens, BOS / EOS ids and, when given, a chat template.
gguf_file write_gguf(const std::string* jinja, std::vector<std::byte>& image) {
  gguf_writer w;
  const std::vector<std::string> tokens{"<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "a"};
  w.add("general.architecture", std::string_view("llama"));
  w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  w.add("tokenizer.ggml.bos_token_id", std::uint32_t{1});
  w.add("tokenizer.ggml.eos_token_id", std::uint32_t{2});
  if (jinja) w.add("tokenizer.chat_template", std::string_view(*jinja));
  image = w.bytes();
  return gguf_file(std::span<const std::byte>(image));
}
}  // namespace

TEST_CASE("chat_template: from_gguf reads tokenizer.chat_template and the vocabulary's BOS / EOS") {
  std::vector<std::byte> image;
  {
    const auto f = write_gguf(&llama3_jinja, image);
    const auto t = chat_template::from_gguf(f);
    REQUIRE(t.family() == chat_family::llama3);
    REQUIRE(t.bos_text() == "<|begin_of_text|>");
    REQUIRE(t.eos_text() == "<|end_of_text|>");
    REQUIRE(t.end_of_turn_text() == "<|eot_id|>");
    REQUIRE(t.format(one_turn, exact).starts_with("<|begin_of_text|><|start_header_id|>user"));
    // A name overrides the file's template; the texts still come from the vocabulary.
    const auto z = chat_template::from_gguf(f, "zephyr");
    REQUIRE(z.family() == chat_family::zephyr);
    REQUIRE(z.format(one_turn) == "<|user|>\nHi<|end_of_text|>\n<|assistant|>\n");
    REQUIRE_THROWS_AS(chat_template::from_gguf(f, "nope"), llmkit::error);
  }
  {
    const auto f = write_gguf(&zephyr_jinja, image);
    REQUIRE(chat_template::from_gguf(f).family() == chat_family::zephyr);
  }
  {
    const auto f = write_gguf(nullptr, image);
    const std::string e = error_of([&] { chat_template::from_gguf(f); });
    REQUIRE(e ==
            "chat_template: the model has no tokenizer.chat_template; choose a built-in template by name (llama3, "
            "llama3.1, chatml, qwen2, qwen2.5, llama2, mistral, mistral-v1, mistral-v3, zephyr, gemma, phi3, "
            "phi4-mini, phi4, qwen3, harmony)");
    REQUIRE(chat_template::from_gguf(f, "llama2").family() == chat_family::llama2);
  }
  {
    const auto f = write_gguf(&vicuna_jinja, image);
    REQUIRE(error_of([&] { chat_template::from_gguf(f); }).find("is not one of the built-in families") !=
            std::string::npos);
  }
  {
    // A BOS id outside the vocabulary.
    gguf_writer w;
    const std::vector<std::string> tokens{"a", "b"};
    w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    w.add("tokenizer.ggml.bos_token_id", std::uint32_t{2});
    w.add("tokenizer.chat_template", std::string_view(chatml_jinja));
    image = w.bytes();
    const gguf_file f{std::span<const std::byte>(image)};
    REQUIRE(error_of([&] { chat_template::from_gguf(f); }) ==
            "chat_template: tokenizer.ggml.bos_token_id = 2 is outside the vocabulary of 2 tokens");
  }
  {
    // A template that is not a string.
    gguf_writer w;
    w.add("tokenizer.chat_template", std::uint32_t{3});
    image = w.bytes();
    const gguf_file f{std::span<const std::byte>(image)};
    REQUIRE_THROWS_AS(chat_template::from_gguf(f), llmkit::error);
  }
}

TEST_CASE("chat_template: the vendored stories260K has no template") {
  const auto f = gguf_file::open(LLMKIT_DEFAULT_MODEL);
  REQUIRE_THROWS_WITH(chat_template::from_gguf(f), Catch::Contains("no tokenizer.chat_template"));
  const auto z = chat_template::from_gguf(f, "zephyr");
  REQUIRE(z.bos_text() == "<s>");
  REQUIRE(z.eos_text() == "</s>");
}

TEST_CASE("chat_template: format_marked says where each message's content is, for every family") {
  // Contents that a template keeps whole (no surrounding blanks to strip).
  const std::vector<chat_message> chat{{"system", "S<|im_start|>0"},
                                       {"user", "U</s>1"},
                                       {"assistant", "A<|eot_id|>2"},
                                       {"user", "U[INST]3"}};
  for (const auto name : chat_template::names) {
    INFO(name);
    const auto t = chat_template::by_name(name);
    for (const auto& options : {exact, exact_no_prompt, chat_format_options{}}) {
      const formatted_chat f = t.format_marked(chat, options);
      REQUIRE(f.text == t.format(chat, options));
      std::vector<std::string> spans;
      std::size_t end = 0;
      for (const auto& s : f.contents) {
        REQUIRE(s.length > 0);
        REQUIRE(s.offset >= end);  // sorted, not overlapping
        end = s.end();
        REQUIRE(end <= f.text.size());
        spans.push_back(f.text.substr(s.offset, s.length));
      }
      std::sort(spans.begin(), spans.end());
      REQUIRE(spans == std::vector<std::string>{"A<|eot_id|>2", "S<|im_start|>0", "U</s>1", "U[INST]3"});
    }
  }
}

TEST_CASE("chat_template: format_marked follows the template's trimming") {
  const auto llama3 = chat_template::by_name("llama3");
  const auto f = llama3.format_marked(std::vector<chat_message>{{"user", "  Hi there \n"}});
  REQUIRE(f.contents.size() == 1);
  REQUIRE(f.text.substr(f.contents[0].offset, f.contents[0].length) == "Hi there");
  // Llama 2 strips "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content as one text:
  // an empty first turn takes the blank lines after <</SYS>> with it.
  const auto llama2 = chat_template::by_name("llama2");
  const auto g = llama2.format_marked(std::vector<chat_message>{{"system", " S "}, {"user", " "}});
  REQUIRE(g.text == "[INST] <<SYS>>\n S \n<</SYS>> [/INST]");
  REQUIRE(g.contents == std::vector<text_span>{{.offset = 15, .length = 3}});
  const auto h = llama2.format_marked(std::vector<chat_message>{{"system", "S"}, {"user", " Hi "}});
  REQUIRE(h.text == "[INST] <<SYS>>\nS\n<</SYS>>\n\n Hi [/INST]");
  REQUIRE(h.contents == std::vector<text_span>{{.offset = 15, .length = 1}, {.offset = 27, .length = 3}});
}

TEST_CASE("chat_template: gemma writes <start_of_turn> turns, model answers, the system message in the first turn") {
  REQUIRE(format("gemma", conversation) ==
          "<bos><start_of_turn>user\nYou are a pirate.\n\nHello<end_of_turn>\n<start_of_turn>model\nAhoy!<end_of_turn>\n"
          "<start_of_turn>user\nWho are you?<end_of_turn>\n<start_of_turn>model\n");
  REQUIRE(chat_template::by_name("gemma").format(one_turn) ==
          "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  REQUIRE(format("gemma", one_turn, exact_no_prompt) == "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  const auto marked = chat_template::by_name("gemma").format_marked(conversation);
  REQUIRE(marked.contents.size() == 4);
  REQUIRE(marked.text.substr(marked.contents[0].offset, marked.contents[0].length) == "You are a pirate.");
  REQUIRE(marked.text.substr(marked.contents[1].offset, marked.contents[1].length) == "Hello");
  REQUIRE(chat_template::by_name("gemma").end_of_turn_text() == "<end_of_turn>");
  const std::vector<chat_message> two_users{{"user", "a"}, {"user", "b"}};
  REQUIRE(error_of([&] { chat_template::by_name("gemma").format(two_users); }) ==
          "chat_template gemma: after the optional system message the roles must alternate user / assistant / user / "
          "..., but message 1 is 'user'");
}

TEST_CASE("chat_template: phi3, phi4-mini and phi4") {
  REQUIRE(format("phi3", conversation) ==
          "<|system|>\nYou are a pirate.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n  Ahoy!  <|end|>\n"
          "<|user|>\nWho are you?<|end|>\n<|assistant|>\n");
  REQUIRE(format("phi3", one_turn, exact_no_prompt) == "<|user|>\nHi<|end|>\n<|endoftext|>");
  const std::vector<chat_message> empty_system{{"system", ""}, {"user", "Hi"}};
  REQUIRE(format("phi3", empty_system) == "<|user|>\nHi<|end|>\n<|assistant|>\n");
  REQUIRE(format("phi4-mini", conversation) ==
          "<|system|>You are a pirate.<|end|><|user|>Hello<|end|><|assistant|>  Ahoy!  <|end|><|user|>Who are "
          "you?<|end|><|assistant|>");
  REQUIRE(format("phi4-mini", one_turn, exact_no_prompt) == "<|user|>Hi<|end|><|endoftext|>");
  REQUIRE(format("phi4", conversation) ==
          "<|im_start|>system<|im_sep|>You are a pirate.<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
          "<|im_start|>assistant<|im_sep|>  Ahoy!  <|im_end|><|im_start|>user<|im_sep|>Who are you?<|im_end|>"
          "<|im_start|>assistant<|im_sep|>");
  REQUIRE(format("phi4", one_turn, exact_no_prompt) == "<|im_start|>user<|im_sep|>Hi<|im_end|>");
  REQUIRE(chat_template::by_name("phi3").end_of_turn_text() == "<|end|>");
  REQUIRE(chat_template::by_name("phi4-mini").end_of_turn_text() == "<|end|>");
  REQUIRE(chat_template::by_name("phi4").end_of_turn_text() == "<|im_end|>");
}

TEST_CASE("chat_template: qwen3 thinking blocks and enable_thinking") {
  const std::string body =
      "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n  Ahoy!  <|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n";
  REQUIRE(format("qwen3", conversation) == body + "<|im_start|>assistant\n");
  chat_format_options no_thinking = exact;
  no_thinking.enable_thinking = false;
  REQUIRE(format("qwen3", conversation, no_thinking) == body + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // No default system message (unlike qwen2 / qwen2.5).
  REQUIRE(format("qwen3", one_turn) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // An earlier answer loses its reasoning; the last one, after the last
  // user message, keeps it (and gets an empty block when it has none).
  const std::vector<chat_message> history{
      {"user", "Hi"}, {"assistant", "<think>\nhmm\n</think>\n\nHello!"}, {"user", "Again"}};
  REQUIRE(format("qwen3", history, exact_no_prompt) ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n");
  const std::vector<chat_message> last{{"user", "Hi"}, {"assistant", "<think>\nhmm\n</think>\n\nHello!"}};
  REQUIRE(format("qwen3", last, exact_no_prompt) ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n");
  const std::vector<chat_message> plain{{"user", "Hi"}, {"assistant", "Hello!"}};
  REQUIRE(format("qwen3", plain, exact_no_prompt) ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
  REQUIRE(chat_template::by_name("qwen3").has_reasoning());
  REQUIRE_FALSE(chat_template::by_name("qwen2.5").has_reasoning());
  REQUIRE(chat_template::by_name("qwen3").end_of_turn_text() == "<|im_end|>");
}

TEST_CASE("chat_template: split_reasoning separates a thinking block from the answer") {
  auto check = [](std::string_view text, std::string_view reasoning, std::string_view content) {
    const auto s = split_reasoning(text);
    INFO(text);
    REQUIRE(s.reasoning == reasoning);
    REQUIRE(s.content == content);
  };
  check("<think>\nLet me see.\n</think>\n\nFour.", "Let me see.", "Four.");
  check("Let me see.\n</think>\n\nFour.", "Let me see.", "Four.");  // <think> was in the prompt
  check("<think>\n\n</think>\n\nFour.", "", "Four.");
  check("Four.", "", "Four.");
  check("<think>\nStill thinking", "Still thinking", "");  // cut off by max_tokens
  check("", "", "");
}

// gpt-oss's template (models/templates/openai-gpt-oss-120b.jinja in
// llama.cpp), rendered with @huggingface/jinja 0.5.13 (transformers.js's
// Jinja) on 2026-12-07: the expected strings below are its output.
namespace {
const std::string harmony_system =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2026-12-07\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>";
const chat_format_options harmony_dated{.current_date = "2026-12-07"};
const chat_format_options harmony_dated_no_prompt{.prompt = generation_prompt::omit, .current_date = "2026-12-07"};
}  // namespace

TEST_CASE("chat_template: harmony (gpt-oss) as its template renders it") {
  const auto t = chat_template::by_name("harmony");
  const std::vector<chat_message> one{{"user", "Hi"}};
  REQUIRE(t.format(one, harmony_dated) == harmony_system + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  REQUIRE(t.format(one, harmony_dated_no_prompt) == harmony_system + "<|start|>user<|message|>Hi<|end|>");
  const std::vector<chat_message> sys{
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  const std::string sys_body = harmony_system +
                               "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|"
                               "message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|><|start|>"
                               "user<|message|>Bye<|end|>";
  REQUIRE(t.format(sys, harmony_dated) == sys_body + "<|start|>assistant");
  REQUIRE(t.format(sys, harmony_dated_no_prompt) == sys_body);
  // An empty system message writes no developer message; a later one writes nothing.
  REQUIRE(t.format(std::vector<chat_message>{{"system", ""}, {"user", "Hi"}}, harmony_dated) ==
          harmony_system + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  REQUIRE(t.format(std::vector<chat_message>{{"user", "Hi"}, {"system", "ignored?"}, {"user", "x"}}, harmony_dated) ==
          harmony_system + "<|start|>user<|message|>Hi<|end|><|start|>user<|message|>x<|end|><|start|>assistant");
  // A last answer ends with <|return|> only without the generation prompt.
  const std::vector<chat_message> answered{{"user", "Hi"}, {"assistant", "Hello."}};
  const std::string answered_body =
      harmony_system + "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello.";
  REQUIRE(t.format(answered, harmony_dated) == answered_body + "<|end|><|start|>assistant");
  REQUIRE(t.format(answered, harmony_dated_no_prompt) == answered_body + "<|return|>");
  // Reasoning effort; today's date when none is given.
  chat_format_options high = harmony_dated;
  high.reasoning_effort = "high";
  std::string high_system = harmony_system;
  high_system.replace(high_system.find("medium"), 6, "high");
  REQUIRE(t.format(one, high) == high_system + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  const std::string today = t.format(one);
  const std::size_t at = today.find("Current date: ");
  REQUIRE(at != std::string::npos);
  REQUIRE(today.substr(at + 14, 2) == "20");
  REQUIRE(today.substr(at + 24, 2) == "\n\n");
  // Bad options name themselves.
  chat_format_options bad = harmony_dated;
  bad.reasoning_effort = "max";
  REQUIRE(error_of([&] { t.format(one, bad); }).find("reasoning_effort is 'max'") != std::string::npos);
  bad = harmony_dated;
  bad.current_date = "7 Dec 2026";
  REQUIRE(error_of([&] { t.format(one, bad); }).find("current_date is '7 Dec 2026'; it is YYYY-MM-DD") !=
          std::string::npos);
  REQUIRE(t.end_of_turn_text() == "<|return|>");
  REQUIRE_FALSE(t.has_reasoning());
  // Detected from its template's markers.
  REQUIRE(chat_template::detect("{{- \"<|start|>system<|message|>\" }}{{- \"<|channel|>final<|message|>\" }}").family() ==
          chat_family::harmony);
}

TEST_CASE("chat_template: split_harmony separates the analysis channel from the final answer") {
  const auto both = split_harmony(
      "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>");
  REQUIRE(both.reasoning == "User says hi.");
  REQUIRE(both.content == "Hello!");
  const auto thinking = split_harmony("<|channel|>analysis<|message|>Still think");  // cut off
  REQUIRE(thinking.reasoning == "Still think");
  REQUIRE(thinking.content.empty());
  const auto direct = split_harmony("<|channel|>final<|message|>Hi there");
  REQUIRE(direct.reasoning.empty());
  REQUIRE(direct.content == "Hi there");
  const auto plain = split_harmony("no channels at all");
  REQUIRE(plain.reasoning.empty());
  REQUIRE(plain.content == "no channels at all");
}

TEST_CASE("chat_template: harmony_stream splits a streamed answer as split_harmony splits it whole") {
  const std::vector<std::string> answers{
      "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>final<|message|>Hello! "
      "How can I help?<|return|>",
      "<|channel|>final<|message|>Direct answer with <| odd | text.<|return|>",
      "<|channel|>analysis<|message|>Cut off while thinking",
      "plain text without any header <|end|>",
      "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
      "<|constrain|>json<|message|>{\"x\":1}<|call|>",
      "",
  };
  std::mt19937 rng(7);
  for (const std::string& a : answers) {
    const auto whole = split_harmony(a);
    std::string whole_content(whole.content);
    if (a.find("<|channel|>") == std::string::npos) whole_content = a;  // no header: all content
    for (int trial = 0; trial < 50; ++trial) {
      harmony_stream s;
      std::string reasoning, content;
      for (std::size_t at = 0; at < a.size();) {
        const std::size_t n = std::min<std::size_t>(a.size() - at, 1 + rng() % 7);
        const auto p = s.feed(std::string_view(a).substr(at, n));
        reasoning += p.reasoning;
        content += p.content;
        at += n;
      }
      const auto p = s.finish();
      reasoning += p.reasoning;
      content += p.content;
      INFO(a << " trial " << trial);
      REQUIRE(reasoning == whole.reasoning);
      REQUIRE(content == whole_content);
    }
  }
}
