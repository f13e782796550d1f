#!/usr/bin/env node

// `npx colocated worker --listen HOST:PORT --cpu-devices N --token-file F`:
// this machine's devices served to controllers, running `node` programs on
// this process's event loop and native plugins. The flags are core's table,
// as for `colocated worker` and `python -m colocated.worker`; it prints the
// same single line, `listening on HOST:PORT`, and stops cleanly (status 0) on
// SIGTERM or SIGINT.
const { parseArgs } = require('node:util')
const colocated = require('../index.js')
const binding = require('../binding.js')

const USAGE = 'usage: colocated worker [--flag value ...] (see --help)'

function help(flags) {
  const lines = ['colocated worker: serve this machine’s devices to controllers.', '']
  for (const f of flags) {
    const value = f.kind === 'switch' ? '' : ` <${f.kind}>`
    const extra = [
      f.default !== null && f.default !== undefined ? `default ${f.default}` : null,
      f.repeatable ? 'repeatable' : null,
    ]
    lines.push(
      `  --${f.name}${value}`,
      `      ${f.help}${extra.some(Boolean) ? ` (${extra.filter(Boolean).join('; ')})` : ''}`,
    )
  }
  return lines.join('\n')
}

function main(argv) {
  const [command, ...rest] = argv
  const flags = binding._workerFlags()
  if (command !== 'worker') {
    process.stderr.write(`colocated: unknown command ${JSON.stringify(command ?? '')}\n${USAGE}\n`)
    return 2
  }
  const options = { help: { type: 'boolean' } }
  for (const f of flags) {
    options[f.name] = { type: f.kind === 'switch' ? 'boolean' : 'string', multiple: f.repeatable }
  }
  let parsed
  try {
    parsed = parseArgs({ args: rest, options, strict: true, allowPositionals: false }).values
  } catch (err) {
    process.stderr.write(`colocated: ${err.message}\n${USAGE}\n`)
    return 2
  }
  if (parsed.help) {
    process.stdout.write(`${help(flags)}\n`)
    return 0
  }
  const text = (name) => parsed[name] ?? flags.find((f) => f.name === name)?.default ?? undefined
  const number = (name) => {
    const value = text(name)
    if (value === undefined) return undefined
    const n = Number(value)
    if (value.trim() === '' || !Number.isFinite(n))
      throw new colocated.InvalidArgumentError(`--${name} takes a number, not ${JSON.stringify(value)}`)
    return n
  }
  let worker
  try {
    const cpuDevices = number('cpu-devices')
    if (cpuDevices !== undefined && (!Number.isSafeInteger(cpuDevices) || cpuDevices < 1 || cpuDevices > 4096)) {
      throw new colocated.InvalidArgumentError(`--cpu-devices takes a positive count, not ${text('cpu-devices')}`)
    }
    worker = binding._startWorker({
      listen: text('listen'),
      port: text('port'),
      cpuDevices,
      tokenFile: text('token-file'),
      insecure: parsed.insecure ?? false,
      tlsCert: text('tls-cert'),
      tlsKey: text('tls-key'),
      heartbeatInterval: number('heartbeat-interval'),
      sessionTimeout: number('session-timeout'),
      plugins: parsed.plugin ?? [],
      exitAfterIdle: number('exit-after-idle'),
    })
  } catch (err) {
    process.stderr.write(`colocated: ${err.message}\n`)
    return 2
  }
  process.stdout.write(`listening on ${worker.address}\n`)
  // The worker's threads do not hold the event loop: this does, until a stop.
  const alive = setInterval(() => {
    if (worker.idleExpired) {
      process.stderr.write(`colocated: no session for ${text('exit-after-idle')} s (--exit-after-idle): stopping\n`)
      stop()
    }
  }, 200)
  const stop = () => {
    clearInterval(alive)
    worker.shutdown().catch((err) => {
      process.stderr.write(`colocated: ${err.message}\n`)
      process.exitCode = 1
    })
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
  return undefined
}

const status = main(process.argv.slice(2))
if (status !== undefined) process.exitCode = status
