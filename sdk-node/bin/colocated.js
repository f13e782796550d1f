#!/usr/bin/env node

// `npx colocated status [HOST:PORT ...]`: one line per worker (version,
// devices, sessions, uptime), found as a controller finds them when no address
// is given; exits 1 if one does not answer.
//
// `npx colocated worker --listen HOST:PORT --cpu-devices N --token-file F`:
// this machine's devices served to controllers, running `node` programs on
// an event loop and native plugins. By default each session runs in a worker
// process of its own (this script again, started by core for the session), so
// one controller's JavaScript never shares an event loop with another's;
// `--shared-sessions` serves them all in this process. The flags are core's
// table, as for `colocated worker` and `python -m colocated.worker`; it prints
// the same single line, `listening on HOST:PORT`, and stops cleanly (status 0)
// on SIGTERM or SIGINT.
const { parseArgs } = require('node:util')
const colocated = require('../index.js')
const binding = require('../binding.js')

const USAGE = 'usage: colocated {worker,status} [--flag value ...] (colocated COMMAND --help)'

function help(flags, title) {
  const lines = [title, '']
  for (const f of flags) {
    if (f.hidden) continue
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

/** `args` parsed by core's table `flags`: `{values, positionals}` (an alias's value under the flag's name), or null after a usage error. */
function parse(args, flags, positionals) {
  const options = { help: { type: 'boolean' } }
  for (const f of flags) {
    for (const name of [f.name, ...f.aliases]) {
      options[name] = { type: f.kind === 'switch' ? 'boolean' : 'string', multiple: f.repeatable }
    }
  }
  let parsed
  try {
    parsed = parseArgs({ args, options, strict: true, allowPositionals: positionals })
  } catch (err) {
    process.stderr.write(`colocated: ${err.message}\n${USAGE}\n`)
    return null
  }
  for (const f of flags) {
    for (const alias of f.aliases) {
      if (parsed.values[alias] === undefined) continue
      const given = parsed.values[alias]
      parsed.values[f.name] = f.repeatable ? [...(parsed.values[f.name] ?? []), ...given] : given
      delete parsed.values[alias]
    }
  }
  return parsed
}

/** `colocated status [HOST:PORT ...]`: one line per worker; 1 if one does not answer. */
function statusCommand(rest) {
  const flags = binding._statusFlags()
  const parsed = parse(rest, flags, true)
  if (parsed === null) return 2
  if (parsed.values.help) {
    process.stdout.write(
      `${help(flags, 'colocated status [HOST:PORT ...]: one line per worker (version, devices, sessions, uptime).')}\n`,
    )
    return 0
  }
  const text = (name) => parsed.values[name] ?? flags.find((f) => f.name === name)?.default ?? undefined
  const timeout = Number(text('timeout'))
  binding
    ._status({
      addresses: parsed.positionals,
      tokenFile: text('token-file'),
      tlsCa: text('tls-ca'),
      tlsDomain: text('tls-domain'),
      timeout: Number.isFinite(timeout) ? timeout : Number.NaN,
      cluster: text('cluster'),
      port: text('port'),
    })
    .then(
      ([report, everyone]) => {
        process.stdout.write(report)
        process.exitCode = everyone ? 0 : 1
      },
      (err) => {
        process.stderr.write(`colocated: ${err.message}\n`)
        process.exitCode = 2
      },
    )
  return undefined
}

function main(argv) {
  const [command, ...rest] = argv
  if (command === 'status') return statusCommand(rest)
  if (command !== 'worker') {
    process.stderr.write(`colocated: unknown command ${JSON.stringify(command ?? '')}\n${USAGE}\n`)
    return 2
  }
  const flags = binding._workerFlags()
  const args = parse(rest, flags, false)
  if (args === null) return 2
  const parsed = args.values
  if (parsed.help) {
    process.stdout.write(`${help(flags, 'colocated worker: serve this machine’s devices to controllers.')}\n`)
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
    worker = binding._startWorker(
      {
        listen: text('listen'),
        port: text('port'),
        cpuDevices,
        pjrtPlugin: text('pjrt-plugin'),
        pjrtOptions: parsed['pjrt-option'] ?? [],
        tokenFile: text('token-file'),
        insecure: parsed.insecure ?? false,
        tlsCert: text('tls-cert'),
        tlsKey: text('tls-key'),
        heartbeatInterval: number('heartbeat-interval'),
        sessionTimeout: number('session-timeout'),
        plugins: parsed.plugin ?? [],
        exitAfterIdle: number('exit-after-idle'),
        trace: text('trace'),
        isolateSessions: parsed['isolate-sessions'] ?? false,
        sharedSessions: parsed['shared-sessions'] ?? false,
        singleSession: parsed['single-session'] ?? false,
      },
      [process.execPath, ...process.execArgv, __filename, 'worker'],
    )
  } catch (err) {
    process.stderr.write(`colocated: ${err.message}\n`)
    return 2
  }
  process.stdout.write(`listening on ${worker.address}\n`)
  // The worker's threads do not hold the event loop: this does, until a stop.
  const alive = setInterval(() => {
    if (worker.idleExpired) {
      // A session worker's one session ended (or its supervisor went): no note.
      if (!parsed['single-session'])
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

const exitStatus = main(process.argv.slice(2))
if (exitStatus !== undefined) process.exitCode = exitStatus
