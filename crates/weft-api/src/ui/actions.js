// What an admin token can do from the dashboard: create, delete and resize
// volumes, attach and detach hosts, take, clone and delete snapshots, move
// a replicated volume's primary, cordon, uncordon and drain nodes, clear a
// pool's failure. Each action is one API call; what destroys anything asks
// first; a refusal shows the API's own message and hint where the action
// was asked. The controls carry the class "action": shown to an admin token
// only (body.can-act), the API refuses the others anyway.
"use strict";

const dialogState = { volume: null }; // the volume whose dialog is open

const SIZE_UNITS = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 };

// Sizes as the CLI takes them: bytes, or a number with KiB, MiB, GiB, TiB
// (or k, M, G, T; any case).
function parseSize(text) {
  const match = /^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$/i.exec(text);
  if (!match || (match[3] && !match[2] && match[3].toLowerCase() !== "b")) {
    throw new Error(`"${text}" is not a size: use bytes or a number with KiB, MiB, GiB or TiB`);
  }
  return Number(match[1]) * SIZE_UNITS[match[2].toLowerCase()];
}

// Says `text` in `where` (a live region), as an error or as done.
function tell(where, text, className) {
  where.textContent = text;
  where.className = `said ${className}`;
}

function apiError(error) {
  return error.hint ? `${error.message} (${error.hint})` : error.message;
}

// Runs `action` (an async API call) for a control; shows a refusal in
// `where` (an element with role=alert), and asks for a new view after.
async function act(where, action) {
  where.textContent = "";
  try {
    await action();
    return true;
  } catch (error) {
    tell(where, apiError(error), "error");
    return false;
  } finally {
    wakeUp();
  }
}

// Asks before anything is destroyed: true if the operator said yes.
function confirmAction(text, verb) {
  const dialog = $("confirm-dialog");
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = verb;
  dialog.returnValue = "";
  dialog.showModal();
  $("confirm-cancel").focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

function button(text, onClick, className) {
  const node = el("button", text, className);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

function path(...parts) {
  return parts.map(encodeURIComponent).join("/");
}

// A node's actions, for its row.
function nodeActions(node) {
  const cell = el("span", null, "action row-actions");
  const say = $("cluster-error");
  const call = (verb) => () => act(say, () => api(path("nodes", node.name, verb), { method: "POST" }));
  if (node.state === "cordoned") cell.appendChild(button("Uncordon", call("uncordon")));
  else cell.appendChild(button("Cordon", call("cordon")));
  cell.appendChild(
    button("Drain", async () => {
      const text = `Drain node ${node.name}? Its primaries move to other nodes and no new volume is placed on it.`;
      if (await confirmAction(text, "Drain")) await call("drain")();
    }),
  );
  return cell;
}

// A pool's actions: clearing its failure once the cause is mended.
function poolActions(pool) {
  if (pool.state !== "failed") return "";
  const query = pool.node ? `?node=${encodeURIComponent(pool.node)}` : "";
  return button(
    "Clear failure",
    async () => {
      const text = `Clear pool ${pool.name}'s failure (${pool.failure || "failed"})? Do it once the device is back: I/O resumes on it.`;
      if (await confirmAction(text, "Clear failure")) {
        await act($("capacity-error"), () => api(`${path("pools", pool.name, "clear-failure")}${query}`, { method: "POST" }));
      }
    },
    "action",
  );
}

// A volume's name, opening its dialog.
function volumeButton(name) {
  const node = button(name, () => openVolume(name), "link");
  node.setAttribute("aria-haspopup", "dialog");
  return node;
}

function openVolume(name) {
  dialogState.volume = name;
  $("volume-error").textContent = "";
  $("snapshot-name").value = "";
  $("clone-name").value = "";
  $("resize-size").value = "";
  renderVolumeDialog();
  $("volume-dialog").showModal();
}

function closeDialogs() {
  for (const id of ["volume-dialog", "confirm-dialog"]) if ($(id).open) $(id).close();
  dialogState.volume = null;
}

function options(select, values, empty) {
  if (same(select, JSON.stringify([values, empty]))) return;
  const chosen = select.value;
  select.replaceChildren();
  if (empty !== undefined) select.appendChild(el("option", empty));
  if (empty !== undefined) select.options[0].value = "";
  for (const value of values) {
    const option = el("option", value);
    option.value = value;
    select.appendChild(option);
  }
  if (values.includes(chosen)) select.value = chosen;
}

// What the volume dialog shows, from the last view (kept while open).
function renderVolumeDialog() {
  const s = state.previous;
  const name = dialogState.volume;
  if (!s || name === null) return;
  const volume = s.volumes.find((v) => v.name === name);
  // Each part rebuilt only when what it shows changed: a focused control
  // in one part stays while the figures of another move.
  const hostNames = s.hosts.map((h) => h.name);
  $("volume-dialog-title").textContent = `Volume ${name}`;
  const facts = $("volume-facts");
  $("volume-actions").hidden = !volume;
  if (!volume) {
    if (!same(facts, "deleted")) facts.replaceChildren(el("dt", "State"), el("dd", "deleted"));
    return;
  }
  renderVolumeFacts(facts, volume);
  if (!same($("volume-hosts"), JSON.stringify([name, volume.hosts]))) renderVolumeHosts(name, volume);
  options(
    $("attach-host"),
    hostNames.filter((h) => !volume.hosts.includes(h)),
  );
  $("attach-form").hidden = $("attach-host").options.length === 0;
  if (!same($("volume-snapshots"), JSON.stringify([name, volume.snapshots]))) renderVolumeSnapshots(name, volume);
  options($("clone-snapshot"), volume.snapshots);
  $("clone-form").hidden = volume.snapshots.length === 0;

  const replicas = volume.replicas || [];
  const primary = replicas.find((r) => r.role === "primary");
  const others = replicas.filter((r) => r.role !== "primary").map((r) => r.node);
  $("move-form").hidden = !primary || others.length === 0;
  options($("move-to"), others);
}

function renderVolumeFacts(facts, volume) {
  const list = [];
  const fact = (term, value) => list.push([term, value]);
  fact("Size", `${bytes(volume.size_bytes)} (${bytes(volume.allocated_bytes)} allocated)`);
  fact("Pool", volume.node ? `${volume.pool} on ${volume.node}` : volume.pool);
  fact("State", volume.state + (volume.failure ? `: ${volume.failure}` : ""));
  fact("NQN", volume.nqn);
  fact("Copies", copies(volume));
  if (volume.origin) fact("Cloned from", volume.origin);
  if (volume.encryption) fact("Encryption", `${volume.encryption.cipher}, ${volume.encryption.state}`);
  fact("Limits", limits(volume.qos) || "none");
  fact("Connected", volume.connected_hosts.join(", ") || "none");
  if (same(facts, JSON.stringify(list))) return;
  facts.replaceChildren(...list.flatMap(([term, value]) => [el("dt", term), el("dd", value)]));
}

// A list of a volume's things (its hosts, its snapshots), each with a
// button that removes it once the operator said yes.
function removableList(list, names, empty, remove) {
  list.replaceChildren(
    ...names.map((thing) => {
      const item = el("li", thing);
      item.appendChild(
        button(
          remove.label,
          async () => {
            if (await confirmAction(remove.question(thing), remove.verb)) {
              await act($("volume-error"), () => api(remove.path(thing), { method: "DELETE" }));
            }
          },
          "action",
        ),
      );
      return item;
    }),
  );
  if (names.length === 0) list.appendChild(el("li", empty));
}

function renderVolumeHosts(name, volume) {
  removableList($("volume-hosts"), volume.hosts, "no host attached", {
    label: "Detach",
    verb: "Detach",
    question: (host) => `Detach host ${host} from ${name}? It loses access to the volume at once.`,
    path: (host) => path("volumes", name, "hosts", host),
  });
}

function renderVolumeSnapshots(name, volume) {
  removableList($("volume-snapshots"), volume.snapshots, "no snapshot", {
    label: "Delete",
    verb: "Delete snapshot",
    question: (snapshot) => `Delete snapshot ${snapshot} of ${name}? What it holds is gone for good.`,
    path: (snapshot) => path("volumes", name, "snapshots", snapshot),
  });
}

// The volume list's own controls and the open dialog, after each view.
function renderActions(s) {
  // A cluster places a volume itself when no pool is named.
  options($("new-pool"), [...new Set(s.pools.map((p) => p.name))].sort(), state.cluster ? "any" : undefined);
  $("new-replicas-field").hidden = !state.cluster;
  if (dialogState.volume !== null) renderVolumeDialog();
}

function onSubmit(id, handler) {
  $(id).addEventListener("submit", (event) => {
    event.preventDefault();
    handler();
  });
}

function setUpActions() {
  for (const id of ["confirm-yes", "confirm-cancel"]) {
    $(id).addEventListener("click", () => $("confirm-dialog").close(id === "confirm-yes" ? "yes" : "cancel"));
  }
  $("volume-close").addEventListener("click", () => closeDialogs());
  $("volume-dialog").addEventListener("close", () => {
    dialogState.volume = null;
  });

  onSubmit("new-volume-form", async () => {
    const say = $("new-volume-error");
    const name = $("new-name").value.trim();
    const done = await act(say, () => {
      const body = { name, size_bytes: parseSize($("new-size").value) };
      if ($("new-pool").value) body.pool = $("new-pool").value;
      const copies = Number($("new-replicas").value);
      if (state.cluster && copies > 1) body.replicas = copies;
      return api("volumes", { method: "POST", body });
    });
    if (done) {
      $("new-name").value = "";
      tell(say, `Volume ${name} created.`, "ok");
    }
  });

  const volumeCall = (method, suffix, body) => () =>
    api(path("volumes", dialogState.volume, ...suffix), { method, body: body && body() });

  onSubmit("resize-form", () =>
    act($("volume-error"), volumeCall("POST", ["resize"], () => ({ size_bytes: parseSize($("resize-size").value) }))),
  );
  onSubmit("attach-form", () =>
    act($("volume-error"), volumeCall("POST", ["hosts"], () => ({ host: $("attach-host").value }))),
  );
  onSubmit("snapshot-form", async () => {
    if (await act($("volume-error"), volumeCall("POST", ["snapshots"], () => ({ name: $("snapshot-name").value.trim() })))) {
      $("snapshot-name").value = "";
    }
  });
  onSubmit("clone-form", async () => {
    const name = $("clone-name").value.trim();
    const source = `${dialogState.volume}@${$("clone-snapshot").value}`;
    if (await act($("volume-error"), () => api("volumes", { method: "POST", body: { name, source } }))) {
      $("clone-name").value = "";
      tell($("volume-error"), `Volume ${name} cloned from ${source}.`, "ok");
    }
  });
  onSubmit("move-form", async () => {
    const to = $("move-to").value;
    const text = `Move ${dialogState.volume}'s primary to ${to}? Its hosts switch paths (ANA) during the hand-over.`;
    if (await confirmAction(text, "Move primary")) {
      await act($("volume-error"), volumeCall("POST", ["move-primary"], () => ({ to })));
    }
  });
  $("delete-volume").addEventListener("click", async () => {
    const name = dialogState.volume;
    const text = `Delete volume ${name}? Its data and snapshots are gone for good.`;
    if (!(await confirmAction(text, "Delete volume"))) return;
    if (await act($("volume-error"), () => api(path("volumes", name), { method: "DELETE" }))) {
      closeDialogs();
      tell($("new-volume-error"), `Volume ${name} deleted.`, "ok");
    }
  });
}
