// The Vercel AI SDK (`ai` with @ai-sdk/openai chat or responses, or @ai-sdk/anthropic) against
// the gateway: one generateText/streamText call described by the JSON in argv[2]
// ({base, provider: "openai-chat"|"openai-responses"|"anthropic", model, stream, tool, loop, structured, prompt});
// prints the text, the tool calls, the structured output and the gateway's x-detgate-cache header, as JSON.
import { Output, generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
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
const inputSchema = jsonSchema({ type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query', 'limit'], additionalProperties: false });
if (ask.structured) call.output = Output.object({ schema: inputSchema, name: 'search' });
if (ask.tool) {
  // Without `loop`, no execute: the model's call is the answer, one step, as an app that runs
  // tools itself. With it the SDK runs the tool and sends its result back: two steps.
  const execute = async ({ query, limit }) => `${limit} pages about ${query}`;
  call.tools = { search: tool({ description: 'Search the documentation.', inputSchema, ...(ask.loop ? { execute } : {}) }) };
  call.toolChoice = 'required';
  if (ask.loop) {
    // The tool first, then an answer to its output.
    call.prepareStep = ({ stepNumber }) => (stepNumber > 0 ? { toolChoice: 'auto' } : {});
    call.stopWhen = stepCountIs(2);
  }
}

let text, toolCalls, response, output;
if (ask.stream) {
  const result = streamText({ ...call, onError: ({ error }) => { throw error; } });
  text = '';
  for await (const piece of result.textStream) text += piece;
  toolCalls = ask.loop ? (await result.steps).flatMap((step) => step.toolCalls) : await result.toolCalls;
  response = await result.response;
  if (ask.structured) output = await result.output;
} else {
  const result = await generateText(call);
  ({ text, toolCalls, response } = result);
  if (ask.loop) toolCalls = result.steps.flatMap((step) => step.toolCalls);
  if (ask.structured) output = result.output;
}
const calls = toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, arguments: JSON.stringify(c.input) }));
process.stdout.write(JSON.stringify({ cache: response.headers?.['x-detgate-cache'] ?? null, text, tool_calls: calls, output }) + '\n');
