// The Vercel AI SDK (`ai` with @ai-sdk/openai chat or responses, or @ai-sdk/anthropic) against
// the gateway: one generateText/streamText call described by the JSON in argv[2]
// ({base, provider: "openai-chat"|"openai-responses"|"anthropic", model, stream, tool, prompt});
// prints the text, the tool calls and the gateway's x-detgate-cache header, as JSON.
import { generateText, jsonSchema, streamText, tool } from 'ai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';

const ask = JSON.parse(process.argv[2]);
const openai = createOpenAI({ baseURL: ask.base + '/v1', apiKey: 'unused' });
const anthropic = createAnthropic({ baseURL: ask.base + '/v1', apiKey: 'unused' });
const model = {
  'openai-chat': () => openai.chat(ask.model),
  'openai-responses': () => openai.responses(ask.model),
  anthropic: () => anthropic(ask.model),
}[ask.provider]();

const call = { model, prompt: ask.prompt, maxRetries: 0, maxOutputTokens: 64 };
if (ask.tool) {
  // No execute: the model's call is the answer, one step, as an app that runs tools itself.
  const inputSchema = jsonSchema({ type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query', 'limit'], additionalProperties: false });
  call.tools = { search: tool({ description: 'Search the documentation.', inputSchema }) };
  call.toolChoice = 'required';
}

let text, toolCalls, response;
if (ask.stream) {
  const result = streamText({ ...call, onError: ({ error }) => { throw error; } });
  text = '';
  for await (const piece of result.textStream) text += piece;
  toolCalls = await result.toolCalls;
  response = await result.response;
} else {
  ({ text, toolCalls, response } = await generateText(call));
}
const calls = toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, arguments: JSON.stringify(c.input) }));
process.stdout.write(JSON.stringify({ cache: response.headers?.['x-detgate-cache'] ?? null, text, tool_calls: calls }) + '\n');
