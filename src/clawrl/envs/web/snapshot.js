// The page as clawrl's web environment shows it to the model: its interactive elements (and
// headings), each with an id, a role and a label, in document order. Run as a WebDriver script:
// arguments[0] is the id to give the next element seen for the first time. An element keeps its
// id (in data-clawrl-id) for as long as the page lives, so ids in an older listing still name the
// same elements. Returns {title, nextId, elements}.
var nextId = arguments[0];
// MiniWoB's own furniture: the instruction (given to the model as the task), the reward display,
// the click visualiser and the cover shown between episodes
var FURNITURE = ["query", "reward-display", "click-canvas", "sync-task-cover"];
// controls by tag, and by a role that names a control (not a container's role: dialog, tablist, ...)
var ROLES = ["button", "link", "checkbox", "radio", "switch", "tab", "menuitem", "menuitemcheckbox", "menuitemradio",
             "option", "treeitem", "textbox", "searchbox", "combobox", "listbox", "slider", "spinbutton"];
var CONTROLS = "a[href], button, input, select, textarea, summary, h1, h2, h3, [onclick], " +
  ROLES.map(function (role) { return '[role="' + role + '"]'; }).join(", ");

function squash(text) {
  return (text || "").replace(/\s+/g, " ").trim();
}

function visible(element) {
  if (element.getClientRects().length === 0) return false;
  var style = window.getComputedStyle(element);
  return style.visibility !== "hidden" && style.display !== "none";
}

function inFurniture(element) {
  return FURNITURE.some(function (id) {
    var furniture = document.getElementById(id);
    return furniture !== null && furniture.contains(element);
  });
}

// An element a click does something to, by its tag or role, or by the pointer cursor a page puts
// on what it makes clickable (MiniWoB's links are spans with click handlers); not the children of
// such an element, which inherit its cursor
function interactive(element) {
  if (/^(presentation|none)$/.test(element.getAttribute("role") || "")) return false;  // declared not a control
  if (element.matches(CONTROLS)) return !(element.tagName === "INPUT" && element.type === "hidden");
  if (window.getComputedStyle(element).cursor !== "pointer") return false;
  var parent = element.parentElement;
  return parent === null || window.getComputedStyle(parent).cursor !== "pointer";
}

function roleOf(element) {
  var explicit = element.getAttribute("role");
  if (explicit) return explicit;
  var tag = element.tagName.toLowerCase();
  if (tag === "a") return "link";
  if (tag === "button" || tag === "summary") return "button";
  if (tag === "select") return element.multiple ? "listbox" : "combobox";
  if (tag === "textarea") return "textbox";
  if (/^h[1-6]$/.test(tag)) return "heading";
  if (tag === "input") {
    var type = element.type;
    if (type === "checkbox" || type === "radio" || type === "password") return type;
    if (["button", "submit", "reset", "image"].indexOf(type) >= 0) return "button";
    if (type === "range") return "slider";
    return "textbox";
  }
  return "clickable";
}

// The label a user reads for the element: aria-label, a <label> of it, a label just before it
// (MiniWoB's forms put <label>Username</label> before an unassociated input), the placeholder,
// a button's value, the title, or its own text
function labelOf(element) {
  var aria = element.getAttribute("aria-label");
  if (aria) return squash(aria);
  var formField = /^(INPUT|SELECT|TEXTAREA)$/.test(element.tagName);
  if (formField && element.labels && element.labels.length > 0) return squash(element.labels[0].textContent);
  var before = element.previousElementSibling;
  if (formField && before !== null && before.tagName === "LABEL") return squash(before.textContent);
  if (element.placeholder) return squash(element.placeholder);
  if (element.tagName === "INPUT" && /^(button|submit|reset)$/.test(element.type)) return squash(element.value);
  if (element.title) return squash(element.title);
  return formField ? "" : squash(element.innerText);
}

function describe(element) {
  if (!element.dataset.clawrlId) element.dataset.clawrlId = String(nextId++);
  var described = {
    id: Number(element.dataset.clawrlId),
    role: roleOf(element),
    label: labelOf(element).slice(0, 80),
    focused: document.activeElement === element,
    disabled: element.disabled === true,
  };
  if (element.tagName === "SELECT") {
    described.options = Array.prototype.map.call(element.options, function (option) { return squash(option.text); });
    var chosen = element.options[element.selectedIndex];
    described.value = chosen ? squash(chosen.text) : "";
  } else if (element.type === "checkbox" || element.type === "radio") {
    described.checked = element.checked;
  } else if (element.tagName === "TEXTAREA" || (element.tagName === "INPUT" && "value" in element && described.role !== "button")) {
    described.value = element.value.slice(0, 200);
  }
  return described;
}

var elements = [];
document.body.querySelectorAll("*").forEach(function (element) {
  if (interactive(element) && visible(element) && !inFurniture(element)) elements.push(describe(element));
});
return { title: document.title, nextId: nextId, elements: elements };
