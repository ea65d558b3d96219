// The openai npm client against the gateway: one call described by the JSON in argv[2]
// ({base, surface: "chat"|"responses", stream, tool, metadata, prompt}); prints what the app would
// see (text, tool calls, the metadata a response echoes) and the gateway's x-detgate-cache header, as JSON.
import OpenAI from 'openai';

const ask = JSON.parse(process.argv[2]);
const client = new OpenAI({ baseURL: ask.base + '/v1', apiKey: 'unused', maxRetries: 0 });
const parameters = { type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query', 'limit'], additionalProperties: false };

async function chat() {
  const body = { model: ask.model, messages: [{ role: 'user', content: ask.prompt }], stream: ask.stream };
  if (ask.tool) {
    body.tools = [{ type: 'function', function: { name: 'search', description: 'Search the documentation.', parameters } }];
    body.tool_choice = 'required';
  }
  const { data, response } = await client.chat.completions.create(body).withResponse();
  if (!ask.stream) {
    const message = data.choices[0].message;
    const calls = (message.tool_calls || []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
    return { cache: response.headers.get('x-detgate-cache'), text: message.content, tool_calls: calls };
  }
  let text = '';
  const calls = [];
  for await (const chunk of data) {
    const delta = chunk.choices[0]?.delta || {};
    text += delta.content || '';
    for (const c of delta.tool_calls || []) {
      calls[c.index] ??= { id: '', name: '', arguments: '' };
      calls[c.index].id += c.id || '';
      calls[c.index].name += c.function?.name || '';
      calls[c.index].arguments += c.function?.arguments || '';
    }
  }
  return { cache: response.headers.get('x-detgate-cache'), text, tool_calls: calls };
}

async function responses() {
  const body = { model: ask.model, input: ask.prompt };
  if (ask.tool) body.tools = [{ type: 'function', name: 'search', description: 'Search the documentation.', parameters, strict: true }];
  if (ask.metadata) body.metadata = ask.metadata;
  if (!ask.stream) {
    const { data, response } = await client.responses.create(body).withResponse();
    return { cache: response.headers.get('x-detgate-cache'), text: data.output_text, tool_calls: calls(data.output), echo: data.metadata };
  }
  const { data, response } = await client.responses.create({ ...body, stream: true }).withResponse();
  let text = '';
  let done = null;
  for await (const event of data) {
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.completed') done = event.response;
  }
  return { cache: response.headers.get('x-detgate-cache'), text, tool_calls: calls(done.output), echo: done.metadata };
}

function calls(output) {
  return output.filter((i) => i.type === 'function_call').map((i) => ({ id: i.call_id, name: i.name, arguments: i.arguments }));
}

const out = await (ask.surface === 'chat' ? chat() : responses());
process.stdout.write(JSON.stringify(out) + '\n');
