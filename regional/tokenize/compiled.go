package tokenize

import (
	"fmt"
	"strings"
)

// A compiled template renders one known chat template without an
// interpreter: the template's logic written as Go, byte for byte what gonja
// renders from its source (FuzzCompiledTemplates renders random message
// lists both ways). NewTemplate recognises a known source by its exact
// text and uses the compiled form for it; any other template, and any
// input a compiled form does not cover, goes through gonja.
type compiled struct {
	family string
	form   compiledForm
	// arg is the form's variant: what follows an assistant turn's end of
	// sentence (Mistral), the generation prompt's opening (DeepSeek-R1).
	arg string
}

// compiledForm is the Go code rendering a compiled template.
type compiledForm uint8

const (
	formChatML compiledForm = iota
	formQwen25
	formLlama3
	formMistral
	formGemma
	formDeepSeekR1
)

// render appends the rendering of msgs to b. ok false: not covered,
// render with gonja instead. A template's own refusal (raise_exception)
// is an error, worded as gonja's would be. (A switch, not a func value:
// b does not escape through it.)
func (c *compiled) render(b *renderSink, msgs []Message, gen bool, bos, eos string) (ok bool, err error) {
	switch c.form {
	case formChatML:
		return renderChatML(b, msgs, gen)
	case formQwen25:
		return renderQwen25(b, msgs, gen)
	case formLlama3:
		return renderLlama3(b, msgs, gen, bos)
	case formMistral:
		return renderMistral(b, msgs, bos, eos, c.arg)
	case formGemma:
		return renderGemma(b, msgs, gen, bos)
	case formDeepSeekR1:
		return renderDeepSeekR1(b, msgs, gen, bos, c.arg)
	}
	return false, nil
}

// raised is the error of a template's raise_exception(msg), worded as
// gonja reports it (see NewTemplate's raise_exception and Template.Render).
func raised(msg string) error {
	return fmt.Errorf("%w: render chat template: invalid call to function 'raise_exception': template raised: %s", ErrInvalidPrompt, msg)
}

// compiledFor returns the compiled form of a known template source.
func compiledFor(source string) (compiled, bool) {
	c, ok := knownTemplates[source]
	return c, ok
}

// knownTemplates are the sources with a compiled form: as published in
// each model family's tokenizer_config.json (decoded from JSON) or
// chat_template.jinja, and, for templates on one line, the same with the
// newlines inside its string literals written as \n escapes, as some
// copies have them (the two render alike).
var knownTemplates = func() map[string]compiled {
	m := map[string]compiled{}
	add := func(c compiled, sources ...string) {
		for _, s := range sources {
			m[s] = c
			if !strings.Contains(s, "%}\n") {
				m[strings.ReplaceAll(s, "\n", `\n`)] = c
			}
		}
	}
	add(compiled{family: "chatml", form: formChatML}, DefaultChatTemplate, chatMLSource)
	add(compiled{family: "qwen2.5", form: formQwen25}, qwen25Source)
	add(compiled{family: "llama3", form: formLlama3}, llama3Source)
	add(compiled{family: "mistral", form: formMistral, arg: " "}, mistralSource)
	add(compiled{family: "mixtral", form: formMistral}, mixtralSource)
	add(compiled{family: "gemma", form: formGemma}, gemmaSource)
	add(compiled{family: "deepseek-r1", form: formDeepSeekR1}, deepSeekR1Source)
	add(compiled{family: "deepseek-r1", form: formDeepSeekR1, arg: "<think>\n"}, deepSeekR1ThinkSource)
	return m
}()

// ChatML as OpenHermes and many fine-tunes publish it; it renders as
// DefaultChatTemplate does.
const chatMLSource = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

func renderChatML(b *renderSink, msgs []Message, gen bool) (bool, error) {
	for _, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
	return true, nil
}

// Qwen2.5's instruct models (tools are not part of a routed request: the
// template's tools branch never runs).
const qwen25Source = `{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
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
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`

func renderQwen25(b *renderSink, msgs []Message, gen bool) (bool, error) {
	if len(msgs) == 0 {
		return false, nil
	}
	if msgs[0].Role == "system" {
		b.WriteString("<|im_start|>system\n")
		b.WriteString(msgs[0].Content)
		b.WriteString("<|im_end|>\n")
	} else {
		b.WriteString("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n")
	}
	for i, m := range msgs {
		switch {
		case m.Role == "user" || (m.Role == "system" && i > 0) || m.Role == "assistant":
			b.WriteString("<|im_start|>")
			b.WriteString(m.Role)
			b.WriteString("\n")
			b.WriteString(m.Content)
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			if i == 0 || msgs[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n")
			b.WriteString(m.Content)
			b.WriteString("\n</tool_response>")
			if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
	return true, nil
}

// Meta-Llama-3-8B-Instruct and -70B-Instruct.
const llama3Source = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

func renderLlama3(b *renderSink, msgs []Message, gen bool, bos string) (bool, error) {
	for i, m := range msgs {
		if i == 0 {
			b.WriteString(bos)
		}
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(strings.TrimSpace(m.Content))
		b.WriteString("<|eot_id|>")
	}
	if gen {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return true, nil
}

// Mistral-7B-Instruct-v0.1 and Mixtral-8x7B-Instruct-v0.1, which differ only
// in what follows an assistant turn's end of sentence.
const (
	mistralSource = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
	mixtralSource = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

func renderMistral(b *renderSink, msgs []Message, bos, eos, afterEOS string) (bool, error) {
	b.WriteString(bos)
	for i, m := range msgs {
		if (m.Role == "user") != (i%2 == 0) {
			return true, raised("Conversation roles must alternate user/assistant/user/assistant/...")
		}
		switch m.Role {
		case "user":
			b.WriteString("[INST] ")
			b.WriteString(m.Content)
			b.WriteString(" [/INST]")
		case "assistant":
			b.WriteString(m.Content)
			b.WriteString(eos)
			b.WriteString(afterEOS)
		default:
			return true, raised("Only user and assistant roles are supported!")
		}
	}
	return true, nil
}

// gemma-7b-it and gemma-2 instruct models.
const gemmaSource = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"

func renderGemma(b *renderSink, msgs []Message, gen bool, bos string) (bool, error) {
	if len(msgs) == 0 {
		return false, nil
	}
	b.WriteString(bos)
	if msgs[0].Role == "system" {
		return true, raised("System role not supported")
	}
	for i, m := range msgs {
		if (m.Role == "user") != (i%2 == 0) {
			return true, raised("Conversation roles must alternate user/assistant/user/assistant/...")
		}
		role := m.Role
		if role == "assistant" {
			role = "model"
		}
		b.WriteString("<start_of_turn>")
		b.WriteString(role)
		b.WriteString("\n")
		b.WriteString(strings.TrimSpace(m.Content))
		b.WriteString("<end_of_turn>\n")
	}
	if gen {
		b.WriteString("<start_of_turn>model\n")
	}
	return true, nil
}

// DeepSeek-R1 and its distilled models (messages carry no tool calls here,
// so the template's tool-call branch never runs), in its two published
// forms: the generation prompt with and without an opening <think>.
const (
	deepSeekR1Source      = `{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '` + "```json" + `' + '\n' + tool['function']['arguments'] + '\n' + '` + "```" + `' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '` + "```json" + `' + '\n' + tool['function']['arguments'] + '\n' + '` + "```" + `' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}`
	deepSeekR1ThinkSource = `{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '` + "```json" + `' + '\n' + tool['function']['arguments'] + '\n' + '` + "```" + `' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '` + "```json" + `' + '\n' + tool['function']['arguments'] + '\n' + '` + "```" + `' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}`
)

func renderDeepSeekR1(b *renderSink, msgs []Message, gen bool, bos, think string) (bool, error) {
	system := ""
	for _, m := range msgs {
		if m.Role == "system" {
			system = m.Content
		}
	}
	b.WriteString(bos)
	b.WriteString(system)
	isTool, outputFirst := false, true
	for _, m := range msgs {
		switch m.Role {
		case "user":
			isTool = false
			b.WriteString("<｜User｜>")
			b.WriteString(m.Content)
		case "assistant":
			if isTool {
				b.WriteString("<｜tool▁outputs▁end｜>")
				b.WriteString(m.Content)
				b.WriteString("<｜end▁of▁sentence｜>")
				isTool = false
				break
			}
			content := m.Content
			if i := strings.LastIndex(content, "</think>"); i >= 0 {
				content = content[i+len("</think>"):]
			}
			b.WriteString("<｜Assistant｜>")
			b.WriteString(content)
			b.WriteString("<｜end▁of▁sentence｜>")
		case "tool":
			isTool = true
			if outputFirst {
				b.WriteString("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>")
				outputFirst = false
			} else {
				b.WriteString("\n<｜tool▁output▁begin｜>")
			}
			b.WriteString(m.Content)
			b.WriteString("<｜tool▁output▁end｜>")
		}
	}
	if isTool {
		b.WriteString("<｜tool▁outputs▁end｜>")
	}
	if gen && !isTool {
		b.WriteString("<｜Assistant｜>")
		b.WriteString(think)
	}
	return true, nil
}
